//! `#[handler]`: binds an async fn to the command type of its first parameter.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat, Type};

const SHAPE: &str = "a chatter handler is `async fn name(command: YourCommand, ctx: &mut HandlerContext) -> Result<(), BoxError>`";

/// Expands the attribute; errors come back as `compile_error!`s next to the untouched function.
pub fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let e = syn::Error::new(
                e.span(),
                format!("`#[handler]` goes on an `async fn`: {SHAPE}"),
            );
            let errors = e.into_compile_error();
            return quote! { #errors #item };
        }
    };
    match check(&args, &function) {
        Ok(command) => registration(&function, command),
        Err(e) => {
            let errors = e.into_compile_error();
            quote! { #errors #function }
        }
    }
}

/// Checks the signature; returns the command type. Every problem is reported at once.
fn check<'a>(args: &TokenStream, f: &'a ItemFn) -> syn::Result<&'a Type> {
    let mut errors: Vec<syn::Error> = Vec::new();
    if !args.is_empty() {
        errors.push(syn::Error::new(
            args.span(),
            "`#[handler]` takes no arguments: the command type comes from the first parameter",
        ));
    }
    let sig = &f.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span(),
            format!("a chatter handler must be `async`: {SHAPE}"),
        ));
    }
    if !sig.generics.params.is_empty() {
        errors.push(syn::Error::new(
            sig.generics.params.span(),
            "a chatter handler cannot be generic: the registry binds it to one concrete command type",
        ));
    }
    let mut command = None;
    if sig.inputs.len() != 2 {
        errors.push(syn::Error::new(
            sig.inputs.span(),
            format!("a chatter handler takes exactly two parameters, the command and the context: {SHAPE}"),
        ));
    }
    if let Some(first) = sig.inputs.first() {
        match first {
            FnArg::Receiver(r) => errors.push(syn::Error::new(
                r.span(),
                "a chatter handler is a free `async fn`, not a method: it cannot take `self`",
            )),
            FnArg::Typed(t) => {
                if matches!(&*t.ty, Type::Reference(_)) {
                    errors.push(syn::Error::new(
                        t.ty.span(),
                        "take the command by value: the handler owns the decoded command",
                    ));
                } else if !matches!(&*t.pat, Pat::Ident(_) | Pat::Wild(_)) {
                    // Destructuring patterns are fine for serde, but keep the registry's view simple.
                    command = Some(&*t.ty);
                } else {
                    command = Some(&*t.ty);
                }
            }
        }
    }
    let mut combined = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    });
    match (combined.take(), command) {
        (None, Some(command)) => Ok(command),
        (Some(e), _) => Err(e),
        (None, None) => Err(syn::Error::new(sig.span(), SHAPE)),
    }
}

fn registration(f: &ItemFn, command: &Type) -> TokenStream {
    let name = &f.sig.ident;
    let ctx_span = f
        .sig
        .inputs
        .iter()
        .nth(1)
        .map(Spanned::span)
        .unwrap_or_else(|| name.span());
    let call = quote_spanned!(ctx_span=> #name(command, ctx));
    let line = quote_spanned!(name.span()=> ::core::line!());
    quote! {
        #f

        const _: () = {
            fn __chatter_invoke<'a>(
                command: ::chatter_runtime::__private::serde_json::Value,
                ctx: &'a mut ::chatter_runtime::HandlerContext,
            ) -> ::core::result::Result<
                ::chatter_runtime::__private::HandlerFuture<'a>,
                ::chatter_runtime::__private::serde_json::Error,
            > {
                let command: #command = ::chatter_runtime::__private::serde_json::from_value(command)?;
                ::core::result::Result::Ok(::std::boxed::Box::pin(async move {
                    ::chatter_runtime::__private::IntoHandlerResult::into_handler_result(#call.await)
                }))
            }

            ::chatter_runtime::__private::inventory::submit! {
                ::chatter_runtime::__private::HandlerRegistration {
                    command: <#command as ::chatter_runtime::DocumentReliable>::registration,
                    handler_name: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#name)),
                    invoke: __chatter_invoke,
                    location: ::chatter_runtime::__private::SourceLocation {
                        module_path: ::core::module_path!(),
                        file: ::core::file!(),
                        line: #line,
                    },
                }
            }
        };
    }
}
