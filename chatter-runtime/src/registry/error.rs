//! Start-time registration problems, each naming every source location involved.

use std::fmt;

use super::SourceLocation;

/// Everything wrong with the registrations, reported at once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RegistryError {
    /// Every problem found, in a stable order.
    pub problems: Vec<RegistrationProblem>,
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "chatter found {n} registration problem{}:",
            if n == 1 { "" } else { "s" }
        )?;
        for problem in &self.problems {
            write!(f, "\n  - {problem}")?;
        }
        Ok(())
    }
}

/// One registration problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationProblem {
    /// Two command types claim one command name.
    #[error(
        "command name `{name}` is registered twice: by `{first_type}` at {first} and by `{second_type}` at {second}; \
         give one of them another name with `#[chatter(name = \"...\")]`"
    )]
    DuplicateCommandName {
        /// The contested name.
        name: &'static str,
        /// The first type.
        first_type: &'static str,
        /// Where the first type was registered.
        first: SourceLocation,
        /// The second type.
        second_type: &'static str,
        /// Where the second type was registered.
        second: SourceLocation,
    },
    /// Two commands are received from one broker destination.
    #[error(
        "destination `{destination}` is claimed by command `{first_name}` at {first} and by command `{second_name}` at {second}; \
         each command needs its own destination (`#[chatter(destination = \"...\")]`)"
    )]
    DuplicateDestination {
        /// The contested destination.
        destination: &'static str,
        /// The first command.
        first_name: &'static str,
        /// Where the first command was registered.
        first: SourceLocation,
        /// The second command.
        second_name: &'static str,
        /// Where the second command was registered.
        second: SourceLocation,
    },
    /// Two handlers are bound to one command.
    #[error(
        "command `{command}` has two handlers: `{first_handler}` at {first} and `{second_handler}` at {second}; \
         a command has exactly one handler"
    )]
    DuplicateHandler {
        /// The command.
        command: &'static str,
        /// The first handler.
        first_handler: &'static str,
        /// Where the first handler was written.
        first: SourceLocation,
        /// The second handler.
        second_handler: &'static str,
        /// Where the second handler was written.
        second: SourceLocation,
    },
    /// A registered command has no handler.
    #[error(
        "command `{command}` (registered at {location}) has no handler; \
         bind one with `#[chatter_runtime::handler] async fn ...(command: {command_type}, ctx: &mut HandlerContext)`"
    )]
    MissingHandler {
        /// The command.
        command: &'static str,
        /// The command's Rust type.
        command_type: &'static str,
        /// Where the command was registered.
        location: SourceLocation,
    },
    /// A handler is bound to a command the registry was not given.
    #[error(
        "handler `{handler}` at {location} handles command `{command}`, which is not registered with this runtime"
    )]
    HandlerForUnregisteredCommand {
        /// The handler.
        handler: &'static str,
        /// The command it handles.
        command: &'static str,
        /// Where the handler was written.
        location: SourceLocation,
    },
    /// One container is registered with two different settings that must agree.
    #[error(
        "container `{database}/{container}` is registered with {setting} {first_value} by `{first_name}` at {first} \
         and {second_value} by `{second_name}` at {second}; registrations sharing a container must agree on it"
    )]
    ConflictingContainer {
        /// The database.
        database: &'static str,
        /// The container.
        container: &'static str,
        /// What disagrees: "partition-key path", "lease container" or "change-feed source identity".
        setting: &'static str,
        /// The first command's value, rendered.
        first_value: String,
        /// The first command.
        first_name: &'static str,
        /// Where the first command was registered.
        first: SourceLocation,
        /// The second command's value, rendered.
        second_value: String,
        /// The second command.
        second_name: &'static str,
        /// Where the second command was registered.
        second: SourceLocation,
    },
    /// One declared source identity pair names two different container pairs.
    #[error(
        "declared source identity (monitored_source `{monitored}`, lease_source `{lease}`) names `{first_containers}` for `{first_name}` at {first} \
         and `{second_containers}` for `{second_name}` at {second}; supply DISTINCT identities for distinct containers"
    )]
    ConflictingSourceIdentity {
        /// The declared monitored identity.
        monitored: &'static str,
        /// The declared lease identity.
        lease: &'static str,
        /// The first command's containers.
        first_containers: String,
        /// The first command.
        first_name: &'static str,
        /// Where the first command was registered.
        first: SourceLocation,
        /// The second command's containers.
        second_containers: String,
        /// The second command.
        second_name: &'static str,
        /// Where the second command was registered.
        second: SourceLocation,
    },
}
