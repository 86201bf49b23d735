//! Why `chatter` stopped, and how it prints an error.

/// Why `chatter` stopped, with its exit code.
pub(crate) enum Failure {
    /// Bad input: exit code 2.
    Input(String),
    /// The store could not be read: exit code 3.
    Store(String),
}

/// An error and its causes on one line.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    chatter_runtime::error::ErrorChain(error).to_string()
}
