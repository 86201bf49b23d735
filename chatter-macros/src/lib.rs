//! Derive and attribute macros for `chatter`. Use them through `chatter_runtime`, which re-exports
//! them and holds the types the generated code names.

mod internals;

use proc_macro::TokenStream;

#[doc = include_str!("../docs/document_reliable.md")]
#[proc_macro_derive(DocumentReliable, attributes(cosmos, partition_key, chatter, inbox))]
pub fn derive_document_reliable(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    internals::document_reliable(&input)
        .unwrap_or_else(|errors| internals::fallback::document_reliable(&input, errors))
        .into()
}

#[doc = include_str!("../docs/handler.md")]
#[proc_macro_attribute]
pub fn handler(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    internals::handler(args.into(), item.clone())
        .unwrap_or_else(|errors| internals::fallback::handler(item, errors))
        .into()
}
