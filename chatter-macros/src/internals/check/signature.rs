//! The `#[handler]` rules, all on the function's signature: the attribute takes no arguments, and
//! the function is an `async fn`, not generic, with two or three parameters: the command first,
//! by value; the context second, as `&mut HandlerContext`; optionally the application state third,
//! as `State<T>`. They belong together because they are the one shape, [`HANDLER_SHAPE`], by which
//! the registry can bind a handler to its command; the derive's rules are in the sibling modules.

use proc_macro2::TokenStream;
use syn::spanned::Spanned;
use syn::{FnArg, Signature, Type};

use super::super::ctxt::Ctxt;

/// The shape every handler must have, quoted by the handler's errors.
pub(crate) const HANDLER_SHAPE: &str = "a chatter handler is `async fn name(command: YourCommand, ctx: &mut HandlerContext) -> Result<(), BoxError>`, with application state as an optional third parameter `state: State<YourState>`";

/// `#[handler]` has no arguments of its own.
pub(super) fn handler_takes_no_arguments(cx: &Ctxt, args: &TokenStream) {
    if !args.is_empty() {
        cx.error(
            args.span(),
            "`#[handler]` takes no arguments: the command type comes from the first parameter",
        );
    }
}

/// A handler is an `async fn`.
pub(super) fn handler_is_async(cx: &Ctxt, sig: &Signature) {
    if sig.asyncness.is_none() {
        cx.error(
            sig.fn_token.span(),
            format!("a chatter handler must be `async`: {HANDLER_SHAPE}"),
        );
    }
}

/// A handler has no generic parameters.
pub(super) fn handler_is_not_generic(cx: &Ctxt, sig: &Signature) {
    if !sig.generics.params.is_empty() {
        cx.error(
            sig.generics.params.span(),
            "a chatter handler cannot be generic: the registry binds it to one concrete command type",
        );
    }
}

/// A handler takes the command and the context, and optionally the application state.
pub(super) fn handler_takes_two_or_three_parameters(cx: &Ctxt, sig: &Signature) {
    if !(2..=3).contains(&sig.inputs.len()) {
        cx.error(
            sig.inputs.span(),
            format!(
                "a chatter handler takes two or three parameters, the command, the context and optionally the state: {HANDLER_SHAPE}"
            ),
        );
    }
}

/// Whether `ty` is a reference to a type named `HandlerContext` (the context in the wrong place).
fn is_context_reference(ty: &Type) -> bool {
    let Type::Reference(reference) = ty else {
        return false;
    };
    matches!(&*reference.elem, Type::Path(path)
        if path.path.segments.last().is_some_and(|s| s.ident == "HandlerContext"))
}

/// The second parameter is the context, taken as `&mut` (the handler stages writes on it).
pub(super) fn context_parameter(cx: &Ctxt, sig: &Signature) {
    // Swapped parameters are reported once, on the first.
    if matches!(sig.inputs.first(), Some(FnArg::Typed(first)) if is_context_reference(&first.ty)) {
        return;
    }
    let Some(FnArg::Typed(t)) = sig.inputs.iter().nth(1) else {
        return;
    };
    match &*t.ty {
        Type::Reference(reference) if reference.mutability.is_some() => {}
        Type::Reference(reference) => cx.syn_error(syn::Error::new_spanned(
            reference,
            "take the context as `&mut HandlerContext`: a handler stages its writes and messages on it, which a shared `&HandlerContext` cannot do",
        )),
        other => cx.error(
            other.span(),
            "take the context as `&mut HandlerContext`: the runtime lends the delivery's context to the handler, it does not give it away",
        ),
    }
}

/// The third parameter, if any, is `State<T>`; returns `Some(None)` without one, `None` when it
/// is something else (reported).
pub(super) fn state_parameter<'a>(cx: &Ctxt, sig: &'a Signature) -> Option<Option<&'a Type>> {
    let Some(third) = sig.inputs.iter().nth(2) else {
        return Some(None);
    };
    let refuse = || {
        cx.syn_error(syn::Error::new_spanned(
            third,
            "the third parameter of a chatter handler is the application state, `State<YourState>` (given to the runtime with `RuntimeBuilder::state`)",
        ));
        None
    };
    let FnArg::Typed(t) = third else {
        return refuse();
    };
    let Type::Path(path) = &*t.ty else {
        return refuse();
    };
    let Some(last) = path.path.segments.last().filter(|s| s.ident == "State") else {
        return refuse();
    };
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return refuse();
    };
    match args.args.first() {
        Some(syn::GenericArgument::Type(state)) if args.args.len() == 1 => Some(Some(state)),
        _ => refuse(),
    }
}

/// The first parameter is the command, taken by value (not `self`, not a reference); any pattern
/// is fine.
pub(super) fn command_parameter<'a>(cx: &Ctxt, sig: &'a Signature) -> Option<&'a Type> {
    match sig.inputs.first()? {
        FnArg::Receiver(r) => {
            cx.error(
                r.span(),
                "a chatter handler is a free `async fn`, not a method: it cannot take `self`",
            );
            None
        }
        FnArg::Typed(t) if is_context_reference(&t.ty) => {
            cx.syn_error(syn::Error::new_spanned(
                &t.ty,
                "the command comes first, then the context: `async fn name(command: YourCommand, ctx: &mut HandlerContext)`",
            ));
            None
        }
        FnArg::Typed(t) if matches!(&*t.ty, Type::Reference(_)) => {
            cx.error(
                t.ty.span(),
                "take the command by value: the handler owns the decoded command",
            );
            None
        }
        FnArg::Typed(t) => Some(&t.ty),
    }
}
