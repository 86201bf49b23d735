//! [`Rejection`]: a handler's "this command is wrong; do not try it again".

/// A handler's refusal of its command for good (a business rule said no: the seat is taken, the
/// order is closed): return it as the handler's error (`Err(Rejection::new(..).into())`, or
/// `?` on a `Result<_, Rejection>`). Nothing is committed, the delivery is not retried, and it
/// is dead-lettered at once with the reason; [`Runtime::dispatch`](crate::Runtime::dispatch)
/// returns it as [`PipelineError::Rejected`](crate::error::PipelineError::Rejected).
///
/// To emit an event about the refusal (e.g. `SeatUnavailable`) and commit it, do not reject:
/// send the event and return `Ok`.
#[derive(Debug, thiserror::Error)]
#[error("{reason}")]
pub struct Rejection {
    reason: String,
    #[source]
    source: Option<crate::registry::BoxError>,
}

impl Rejection {
    /// A rejection saying why.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            source: None,
        }
    }

    /// A rejection because of `error` (any error a retry would meet again).
    pub fn because(reason: impl Into<String>, error: impl Into<crate::registry::BoxError>) -> Self {
        Self {
            reason: reason.into(),
            source: Some(error.into()),
        }
    }

    /// Why.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}
