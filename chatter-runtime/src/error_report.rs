//! [`Report`]: any error, printed with its causes, for `main` and handlers that only pass
//! errors on.

use crate::registry::BoxError;

/// Any error, whose `Display` and `Debug` print it with every cause (`outer: middle: inner`), so
/// `fn main() -> Result<(), Report>` and `eprintln!("{e}")` show why, not only what. Converts
/// from any error with `?`.
///
/// ```
/// fn main() -> Result<(), chatter_runtime::Report> {
///     let _n: u32 = "42".parse()?;
///     Ok(())
/// }
/// ```
pub struct Report(BoxError);

impl Report {
    /// The error.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The error, to downcast or pass on.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

impl<E: Into<BoxError>> From<E> for Report {
    fn from(error: E) -> Self {
        Self(error.into())
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::error_chain::ErrorChain(&*self.0).fmt(f)
    }
}

impl std::fmt::Debug for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_report_prints_every_cause_in_display_and_debug() {
        let report = Report::from(Outer(std::io::Error::other("inner")));
        assert_eq!(report.to_string(), "outer: inner");
        assert_eq!(format!("{report:?}"), "outer: inner");
        assert!(report.error().is::<Outer>());
    }
}
