//! What each macro emits beside its errors, so code naming the command or the handler does not add
//! errors of its own: users see one error, not a cascade.

use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

/// `#[derive(DocumentReliable)]` failed: the errors and a stub impl of the trait (none for a
/// generic type, which the stub could not name correctly).
pub(crate) fn document_reliable(input: &DeriveInput, errors: syn::Error) -> TokenStream {
    let errors = errors.into_compile_error();
    if !input.generics.params.is_empty() {
        return errors;
    }
    let ident = &input.ident;
    quote! {
        #errors

        #[automatically_derived]
        impl ::chatter_runtime::DocumentReliable for #ident {
            fn registration() -> &'static ::chatter_runtime::__private::CommandRegistration {
                ::core::unreachable!()
            }
        }
    }
}

/// `#[handler]` failed: the errors and the function untouched.
pub(crate) fn handler(item: TokenStream, errors: syn::Error) -> TokenStream {
    let errors = errors.into_compile_error();
    quote! { #errors #item }
}
