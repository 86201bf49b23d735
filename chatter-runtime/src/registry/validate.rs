//! Builds the [`Registry`] from the collected registrations and rejects conflicts.

use std::any::TypeId;
use std::collections::HashMap;

use super::{CommandRegistration, HandlerRegistration, RegistrationProblem, RegistryError};
use crate::partition_key;

/// A registered command with its one handler.
#[derive(Debug, Clone, Copy)]
pub struct RegisteredCommand {
    /// The command's registration.
    pub registration: &'static CommandRegistration,
    /// Its handler.
    pub handler: &'static HandlerRegistration,
}

/// The validated set of commands and handlers a runtime serves (the participation allowlist).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    commands: Vec<RegisteredCommand>,
    by_type: HashMap<TypeId, usize>,
    by_destination: HashMap<&'static str, usize>,
}

impl Registry {
    /// Every registration `inventory` collected in this binary.
    pub fn from_inventory() -> Result<Self, RegistryError> {
        Self::build(
            inventory::iter::<CommandRegistration>(),
            inventory::iter::<HandlerRegistration>(),
        )
    }

    /// Validates the given registrations; every problem is reported in one error.
    pub fn build(
        commands: impl IntoIterator<Item = &'static CommandRegistration>,
        handlers: impl IntoIterator<Item = &'static HandlerRegistration>,
    ) -> Result<Self, RegistryError> {
        let mut commands: Vec<&'static CommandRegistration> = commands.into_iter().collect();
        let mut handlers: Vec<&'static HandlerRegistration> = handlers.into_iter().collect();
        // inventory's order depends on link order: sort by source location so messages are stable.
        commands.sort_by_key(|c| (c.location.file, c.location.line, c.command_name));
        handlers.sort_by_key(|h| (h.location.file, h.location.line, h.handler_name));

        let mut problems = Vec::new();
        let kept = distinct_commands(&commands, &mut problems);
        let handler_of = one_handler_each(&kept, &handlers, &mut problems);
        let registry = Self::pair(kept, &handler_of, &mut problems);
        if problems.is_empty() {
            Ok(registry)
        } else {
            Err(RegistryError { problems })
        }
    }

    /// Each kept command with its handler; a command without one is a problem.
    fn pair(
        kept: Vec<&'static CommandRegistration>,
        handler_of: &HashMap<TypeId, &'static HandlerRegistration>,
        problems: &mut Vec<RegistrationProblem>,
    ) -> Self {
        let mut registry = Registry::default();
        for command in kept {
            let type_id = (command.type_id)();
            let Some(&handler) = handler_of.get(&type_id) else {
                problems.push(RegistrationProblem::MissingHandler {
                    command: command.command_name,
                    command_type: (command.type_name)(),
                    location: command.location,
                });
                continue;
            };
            registry.by_type.insert(type_id, registry.commands.len());
            registry
                .by_destination
                .insert(command.destination, registry.commands.len());
            registry.commands.push(RegisteredCommand {
                registration: command,
                handler,
            });
        }
        registry
    }

    /// Every registered command, ordered by source location.
    pub fn commands(&self) -> &[RegisteredCommand] {
        &self.commands
    }

    /// The registered command of type `T`, if `T` takes part.
    pub fn get<T: 'static>(&self) -> Option<&RegisteredCommand> {
        self.get_by_type_id(TypeId::of::<T>())
    }

    /// The registered command with this type identity.
    pub fn get_by_type_id(&self, type_id: TypeId) -> Option<&RegisteredCommand> {
        self.by_type.get(&type_id).map(|&i| &self.commands[i])
    }

    #[cfg(any(test, feature = "test-support"))]
    /// The registered command received from `destination`.
    pub fn get_by_destination(&self, destination: &str) -> Option<&RegisteredCommand> {
        self.by_destination
            .get(destination)
            .map(|&i| &self.commands[i])
    }
}

/// The commands kept, in order: the second of two with one name is dropped; two with one
/// destination, two that share a container but disagree on it, and two that declare one
/// source identity for different containers are problems.
fn distinct_commands(
    commands: &[&'static CommandRegistration],
    problems: &mut Vec<RegistrationProblem>,
) -> Vec<&'static CommandRegistration> {
    let mut kept: Vec<&'static CommandRegistration> = Vec::new();
    let mut by_name: HashMap<&str, &'static CommandRegistration> = HashMap::new();
    let mut by_destination: HashMap<&str, &'static CommandRegistration> = HashMap::new();
    let mut by_container: HashMap<(&str, &str), &'static CommandRegistration> = HashMap::new();
    let mut by_identity: HashMap<(&str, &str), &'static CommandRegistration> = HashMap::new();
    for &command in commands {
        if let Some(first) = by_name.get(command.command_name) {
            problems.push(RegistrationProblem::DuplicateCommandName {
                name: command.command_name,
                first_type: (first.type_name)(),
                first: first.location,
                second_type: (command.type_name)(),
                second: command.location,
            });
            continue;
        }
        by_name.insert(command.command_name, command);
        if let Some(first) = by_destination.insert(command.destination, command) {
            problems.push(RegistrationProblem::DuplicateDestination {
                destination: command.destination,
                first_name: first.command_name,
                first: first.location,
                second_name: command.command_name,
                second: command.location,
            });
        }
        let container_key = (command.database, command.container);
        match by_container.get(&container_key) {
            Some(first) => problems.extend(container_conflicts(first, command)),
            None => {
                by_container.insert(container_key, command);
            }
        }
        if let Some(problem) = identity_conflict(&mut by_identity, command) {
            problems.push(problem);
        }
        kept.push(command);
    }
    kept
}

/// Two commands that declare one source identity (monitored, lease) for different containers.
fn identity_conflict(
    by_identity: &mut HashMap<(&'static str, &'static str), &'static CommandRegistration>,
    command: &'static CommandRegistration,
) -> Option<RegistrationProblem> {
    let declared = command.declared_source_identity?;
    let key = (declared.monitored, declared.lease);
    match by_identity.get(&key) {
        Some(first) if containers(first) != containers(command) => {
            Some(RegistrationProblem::ConflictingSourceIdentity {
                monitored: declared.monitored,
                lease: declared.lease,
                first_containers: containers(first),
                first_name: first.command_name,
                first: first.location,
                second_containers: containers(command),
                second_name: command.command_name,
                second: command.location,
            })
        }
        Some(_) => None,
        None => {
            by_identity.insert(key, command);
            None
        }
    }
}

/// The handler of each kept command, by its type: a handler of a command not kept, and a
/// second handler of one command, are problems.
fn one_handler_each(
    kept: &[&'static CommandRegistration],
    handlers: &[&'static HandlerRegistration],
    problems: &mut Vec<RegistrationProblem>,
) -> HashMap<TypeId, &'static HandlerRegistration> {
    let mut handler_of: HashMap<TypeId, &'static HandlerRegistration> = HashMap::new();
    for &handler in handlers {
        let command = (handler.command)();
        let type_id = (command.type_id)();
        if !kept.iter().any(|c| (c.type_id)() == type_id) {
            problems.push(RegistrationProblem::HandlerForUnregisteredCommand {
                handler: handler.handler_name,
                command: command.command_name,
                location: handler.location,
            });
            continue;
        }
        if let Some(first) = handler_of.get(&type_id) {
            problems.push(RegistrationProblem::DuplicateHandler {
                command: command.command_name,
                first_handler: first.handler_name,
                first: first.location,
                second_handler: handler.handler_name,
                second: handler.location,
            });
            continue;
        }
        handler_of.insert(type_id, handler);
    }
    handler_of
}

fn containers(c: &CommandRegistration) -> String {
    format!("{}/{} (lease {})", c.database, c.container, c.lease)
}

/// Registrations sharing a container must agree on what the container is.
fn container_conflicts(
    first: &'static CommandRegistration,
    second: &'static CommandRegistration,
) -> Vec<RegistrationProblem> {
    let conflict = |setting, first_value: String, second_value: String| {
        RegistrationProblem::ConflictingContainer {
            database: second.database,
            container: second.container,
            setting,
            first_value,
            first_name: first.command_name,
            first: first.location,
            second_value,
            second_name: second.command_name,
            second: second.location,
        }
    };
    let mut problems = Vec::new();
    if !partition_key::same_paths(first.partition_key, second.partition_key) {
        problems.push(conflict(
            "partition-key path",
            partition_key::display(first.partition_key),
            partition_key::display(second.partition_key),
        ));
    }
    if first.lease != second.lease {
        // Two leases over one container would run two relays draining the same outbox documents.
        problems.push(conflict(
            "lease container",
            format!("`{}`", first.lease),
            format!("`{}`", second.lease),
        ));
    }
    if first.declared_source_identity != second.declared_source_identity {
        let render = |c: &CommandRegistration| match c.declared_source_identity {
            Some(d) => format!("(`{}`, `{}`)", d.monitored, d.lease),
            None => "(none declared)".to_owned(),
        };
        problems.push(conflict(
            "change-feed source identity",
            render(first),
            render(second),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_key::PartitionKeyPath;
    use crate::registry::{SourceIdentityDeclaration, SourceLocation};

    struct A;
    struct B;

    const fn at(line: u32) -> SourceLocation {
        SourceLocation {
            module_path: "tests",
            file: "commands.rs",
            line,
        }
    }

    const fn reg(
        name: &'static str,
        destination: &'static str,
        type_id: fn() -> TypeId,
        container: &'static str,
        declared: Option<SourceIdentityDeclaration>,
        line: u32,
    ) -> CommandRegistration {
        const KEY: &[PartitionKeyPath] = &[PartitionKeyPath {
            path: "/k",
            pointer: "/k",
        }];
        CommandRegistration::for_tests(name, destination, type_id, container, KEY, declared, line)
    }

    fn handler_for(
        command: fn() -> &'static CommandRegistration,
        line: u32,
    ) -> HandlerRegistration {
        HandlerRegistration {
            command,
            handler_name: "h",
            invoke: |_, _| Ok(Box::pin(async { Ok(()) })),
            location: at(line),
            state: None,
        }
    }

    fn leak<T>(t: T) -> &'static T {
        Box::leak(Box::new(t))
    }

    #[test]
    fn two_commands_on_one_destination_are_rejected() {
        static RA: CommandRegistration = reg("A", "orders", TypeId::of::<A>, "c1", None, 1);
        static RB: CommandRegistration = reg("B", "orders", TypeId::of::<B>, "c2", None, 2);
        let handlers = [leak(handler_for(|| &RA, 10)), leak(handler_for(|| &RB, 11))];
        let err = Registry::build([&RA, &RB], handlers).unwrap_err();
        assert_eq!(
            err.problems,
            [RegistrationProblem::DuplicateDestination {
                destination: "orders",
                first_name: "A",
                first: at(1),
                second_name: "B",
                second: at(2),
            }]
        );
    }

    #[test]
    fn one_declared_identity_over_two_containers_is_rejected() {
        const ID: Option<SourceIdentityDeclaration> = Some(SourceIdentityDeclaration {
            monitored: "m",
            lease: "l",
        });
        static RA: CommandRegistration = reg("A", "a", TypeId::of::<A>, "c1", ID, 1);
        static RB: CommandRegistration = reg("B", "b", TypeId::of::<B>, "c2", ID, 2);
        let handlers = [leak(handler_for(|| &RA, 10)), leak(handler_for(|| &RB, 11))];
        let err = Registry::build([&RA, &RB], handlers).unwrap_err();
        assert!(matches!(
            err.problems.as_slice(),
            [RegistrationProblem::ConflictingSourceIdentity {
                monitored: "m",
                lease: "l",
                ..
            }]
        ));
        assert!(err.to_string().contains("DISTINCT"));
    }

    #[test]
    fn same_declared_identity_over_the_same_containers_is_one_source() {
        const ID: Option<SourceIdentityDeclaration> = Some(SourceIdentityDeclaration {
            monitored: "m",
            lease: "l",
        });
        static RA: CommandRegistration = reg("A", "a", TypeId::of::<A>, "c1", ID, 1);
        static RB: CommandRegistration = reg("B", "b", TypeId::of::<B>, "c1", ID, 2);
        let handlers = [leak(handler_for(|| &RA, 10)), leak(handler_for(|| &RB, 11))];
        let registry = Registry::build([&RA, &RB], handlers).unwrap();
        assert_eq!(registry.commands().len(), 2);
        assert_eq!(registry.get::<B>().unwrap().registration.command_name, "B");
        assert_eq!(
            registry
                .get_by_destination("a")
                .unwrap()
                .registration
                .command_name,
            "A"
        );
    }

    #[test]
    fn a_handler_for_a_command_not_given_is_rejected() {
        static RA: CommandRegistration = reg("A", "a", TypeId::of::<A>, "c1", None, 1);
        let err = Registry::build([], [leak(handler_for(|| &RA, 10))]).unwrap_err();
        assert!(matches!(
            err.problems.as_slice(),
            [RegistrationProblem::HandlerForUnregisteredCommand { command: "A", .. }]
        ));
    }

    #[test]
    fn an_empty_registry_is_valid() {
        let registry = Registry::build([], []).unwrap();
        assert!(registry.commands().is_empty());
        assert!(registry.get::<A>().is_none());
    }
}
