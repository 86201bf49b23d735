//! Each macro runs three stages, each a plain function over `proc_macro2` types reporting into one
//! [`Ctxt`](ctxt::Ctxt): parse ([`attr`]) -> check ([`check`]) -> expand ([`expand`]). Only expand
//! produces tokens; when parse or check reported anything, [`fallback`] emits the errors instead.

pub(crate) mod attr;
pub(crate) mod check;
pub(crate) mod ctxt;
pub(crate) mod expand;
pub(crate) mod fallback;
pub(crate) mod serde_names;

use proc_macro2::TokenStream;
use syn::{DeriveInput, ItemFn};

use self::ctxt::Ctxt;

/// `#[derive(DocumentReliable)]`: the expansion, or every error at once.
pub(crate) fn document_reliable(input: &DeriveInput) -> syn::Result<TokenStream> {
    let cx = Ctxt::new();
    let command = attr::parse(&cx, input);
    let checked = check::command(&cx, &command);
    cx.check()?;
    let checked = checked.ok_or_else(|| {
        syn::Error::new(
            input.ident.span(),
            "internal error in `#[derive(DocumentReliable)]`: a check failed without reporting why",
        )
    })?;
    Ok(expand::document_reliable(&input.ident, &checked))
}

/// `#[handler]`: the expansion, or every error at once.
pub(crate) fn handler(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let function: ItemFn = syn::parse2(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            format!(
                "`#[handler]` goes on an `async fn`: {}",
                check::HANDLER_SHAPE
            ),
        )
    })?;
    let cx = Ctxt::new();
    let checked = check::handler(&cx, &args, &function);
    cx.check()?;
    let checked =
        checked.ok_or_else(|| syn::Error::new_spanned(&function.sig, check::HANDLER_SHAPE))?;
    Ok(expand::handler(&function, &checked))
}
