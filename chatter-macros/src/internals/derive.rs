//! `#[derive(DocumentReliable)]`: parse -> check -> expand.

use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

use super::{attr, check, expand};

/// Expands the derive; on any error, the errors plus a stub impl (so users see one error, not a
/// cascade from code that names the command).
pub fn expand(input: &DeriveInput) -> TokenStream {
    let mut acc = darling::Error::accumulator();
    let command = attr::parse(input, &mut acc);
    let checked = check::check(&command, &mut acc);
    match (acc.finish(), checked) {
        (Ok(()), Some(checked)) => expand::registration(&input.ident, &checked),
        (result, _) => {
            let errors = result
                .err()
                .map(darling::Error::write_errors)
                .unwrap_or_default();
            let stub = if input.generics.params.is_empty() {
                expand::fallback(&input.ident)
            } else {
                TokenStream::new()
            };
            quote! { #errors #stub }
        }
    }
}
