//! Derive and attribute macros for `chatter`. Use them through `chatter_runtime`, which re-exports
//! them and holds the types the generated code names.

mod internals;

use proc_macro::TokenStream;

/// Registers a command type for the document tier. See `chatter_runtime::DocumentReliable`.
#[proc_macro_derive(DocumentReliable, attributes(cosmos, partition_key, chatter))]
pub fn derive_document_reliable(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    internals::derive::expand(&input).into()
}

/// Binds an `async fn(command: C, ctx: &mut HandlerContext)` as the handler of command `C`.
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    internals::handler::expand(args.into(), item.into()).into()
}
