//! The one error context: every stage reports into it, and it is checked once at the end, so
//! every mistake in the input is reported at once.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;

/// Collects the errors of one macro invocation (serde's `Ctxt`). Stages take `&Ctxt` and report
/// as they go; [`Ctxt::check`] hands back every error combined. Dropping a context that was never
/// checked is a bug and panics.
pub(crate) struct Ctxt {
    /// `None` once checked.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Reports `message` spanned on `span`.
    pub(crate) fn error(&self, span: Span, message: impl Display) {
        self.syn_error(syn::Error::new(span, message));
    }

    /// Reports an error syn built.
    pub(crate) fn syn_error(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check")
            .push(error);
    }

    /// Reports every error in a darling error (which may hold several), keeping its messages and
    /// "did you mean" suggestions.
    pub(crate) fn darling_error(&self, error: darling::Error) {
        for single in error.flatten() {
            self.syn_error(single.into());
        }
    }

    /// Every error reported so far, combined into one; `Ok` when there were none.
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("Ctxt checked twice");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Default for Ctxt {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_errors_checks_ok() {
        assert!(Ctxt::new().check().is_ok());
    }

    #[test]
    fn every_error_comes_back_in_order() {
        let cx = Ctxt::new();
        cx.error(Span::call_site(), "first");
        cx.darling_error(darling::Error::multiple(vec![
            darling::Error::custom("second"),
            darling::Error::custom("third"),
        ]));
        let messages: Vec<String> = cx
            .check()
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages, ["first", "second", "third"]);
    }
}
