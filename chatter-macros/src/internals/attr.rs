//! Parse: the derive input's attributes into plain receivers, reporting malformed syntax.

use darling::FromMeta;
use darling::util::SpannedValue;
use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Attribute, DeriveInput, Ident};

use super::ctxt::Ctxt;
use super::serde_names::{self, FieldSerde};

/// `#[cosmos(...)]`: where the command's documents live.
#[derive(Debug, Default, FromMeta)]
pub(crate) struct CosmosArgs {
    pub database: Option<SpannedValue<String>>,
    pub container: Option<SpannedValue<String>>,
    pub lease: Option<SpannedValue<String>>,
    pub monitored_source: Option<SpannedValue<String>>,
    pub lease_source: Option<SpannedValue<String>>,
}

/// `#[inbox(...)]`: the command is handled through the Standalone Inbox Gate (a claimed marker
/// per message id in an idempotency container) instead of a batch.
#[derive(Debug, Default, FromMeta)]
pub(crate) struct InboxArgs {
    pub database: Option<SpannedValue<String>>,
    pub container: Option<SpannedValue<String>>,
    pub partition_key: Option<SpannedValue<String>>,
    pub marker_ttl: Option<syn::Lit>,
    pub lease: Option<SpannedValue<String>>,
}

/// `#[partition_key(path = "...")]` on the struct: the container's partition-key path(s), in order.
#[derive(Debug, Default, FromMeta)]
pub(crate) struct PartitionKeyArgs {
    #[darling(multiple)]
    pub path: Vec<SpannedValue<String>>,
}

/// `#[chatter(...)]`: how the command is known on the broker.
#[derive(Debug, Default, FromMeta)]
pub(crate) struct ChatterArgs {
    pub name: Option<SpannedValue<String>>,
    pub destination: Option<SpannedValue<String>>,
    pub max_delivery_attempts: Option<syn::Lit>,
}

/// `#[partition_key]` or `#[partition_key(path = "...")]` on a field: this field carries the value.
#[derive(Debug, Default, FromMeta)]
pub(crate) struct FieldPartitionKeyArgs {
    pub path: Option<SpannedValue<String>>,
}

/// An attribute's parsed arguments with the span of the attribute itself.
#[derive(Debug)]
pub(crate) struct Attr<T> {
    pub args: T,
    pub span: Span,
    /// False when the attribute's syntax was already reported: its keys are then unknown, and
    /// "missing key" errors would only repeat the first error.
    pub parsed: bool,
}

/// A named field of the command.
#[derive(Debug)]
pub(crate) struct Field {
    pub ident: Ident,
    pub serde: FieldSerde,
    pub serialized_name: String,
    pub partition_key: Option<Attr<FieldPartitionKeyArgs>>,
}

/// The command as the attributes describe it.
#[derive(Debug)]
pub(crate) struct Command {
    pub ident: Ident,
    pub cosmos: Option<Attr<CosmosArgs>>,
    pub partition_key: Option<Attr<PartitionKeyArgs>>,
    pub chatter: Option<Attr<ChatterArgs>>,
    pub inbox: Option<Attr<InboxArgs>>,
    pub fields: Vec<Field>,
}

/// Parses the derive input. Shape errors (enum, tuple, generics) are reported but parsing goes on
/// as far as it can, so every mistake shows at once.
pub(crate) fn parse(cx: &Ctxt, input: &DeriveInput) -> Command {
    let ident = input.ident.clone();
    if !input.generics.params.is_empty() {
        cx.error(
input.generics.params.span(),
                format!(
                    "`#[derive(DocumentReliable)]` does not support generic parameters: the registry holds one \
                     registration per concrete type; define a non-generic `struct {ident}`"
                ));
    }
    let rename_all = serde_names::container_rename_all(&input.attrs);
    let fields = match &input.data {
        syn::Data::Struct(data) => match &data.fields {
            syn::Fields::Named(named) => named
                .named
                .iter()
                .map(|f| {
                    let ident = f.ident.clone().expect("named fields have identifiers");
                    let serde = serde_names::field(&f.attrs);
                    let serialized_name =
                        serde_names::serialized_name(&ident, &serde, rename_all.as_deref());
                    let partition_key = single_attr(cx, &f.attrs, "partition_key", true);
                    Field {
                        ident,
                        serde,
                        serialized_name,
                        partition_key,
                    }
                })
                .collect(),
            syn::Fields::Unnamed(unnamed) => {
                cx.error(
unnamed.span(),
                        "`#[derive(DocumentReliable)]` needs a struct with named fields, not a tuple struct: \
                         name the fields so a partition-key path can name one");
                Vec::new()
            }
            syn::Fields::Unit => {
                cx.error(
ident.span(),
                        "`#[derive(DocumentReliable)]` needs a struct with named fields, not a unit struct: \
                         a command carries at least its partition-key field");
                Vec::new()
            }
        },
        syn::Data::Enum(data) => {
            cx.error(
                data.enum_token.span(),
                "`#[derive(DocumentReliable)]` goes on a struct with named fields, not an enum: \
                     each command is its own struct",
            );
            Vec::new()
        }
        syn::Data::Union(data) => {
            cx.error(
                data.union_token.span(),
                "`#[derive(DocumentReliable)]` goes on a struct with named fields, not a union",
            );
            Vec::new()
        }
    };
    Command {
        ident,
        cosmos: single_attr(cx, &input.attrs, "cosmos", false),
        partition_key: single_attr(cx, &input.attrs, "partition_key", false),
        chatter: single_attr(cx, &input.attrs, "chatter", false),
        inbox: single_attr(cx, &input.attrs, "inbox", false),
        fields,
    }
}

/// The one attribute named `name`; a second one is an error. `word_ok` lets `#[name]` alone mean
/// "all defaults" (the field-level `#[partition_key]`).
fn single_attr<T: FromMeta + Default>(
    cx: &Ctxt,
    attrs: &[Attribute],
    name: &str,
    word_ok: bool,
) -> Option<Attr<T>> {
    let mut found: Option<Attr<T>> = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident(name)) {
        if found.is_some() {
            cx.error(
attr.path().span(),
                    format!("duplicate `#[{name}]` attribute: merge its keys into the first `#[{name}(...)]`"));
            continue;
        }
        let parsed = match &attr.meta {
            syn::Meta::Path(_) if word_ok => Ok(T::default()),
            syn::Meta::List(list) if list.tokens.is_empty() && word_ok => Ok(T::default()),
            syn::Meta::Path(_) | syn::Meta::NameValue(_) => Err(syn::Error::new(
                attr.path().span(),
                format!("expected `#[{name}(key = \"value\", ...)]`"),
            )
            .into()),
            syn::Meta::List(_) => T::from_meta(&attr.meta).map_err(reword),
        };
        found = Some(match parsed {
            Ok(args) => Attr {
                args,
                span: attr.path().span(),
                parsed: true,
            },
            Err(e) => {
                cx.darling_error(e);
                Attr {
                    args: T::default(),
                    span: attr.path().span(),
                    parsed: false,
                }
            }
        });
    }
    found
}

/// darling's "Unexpected type `path`" for `key = shop` becomes a message that says the fix.
fn reword(error: darling::Error) -> darling::Error {
    darling::Error::multiple(
        error
            .into_iter()
            .map(|e| {
                if e.to_string().starts_with("Unexpected type") {
                    syn::Error::new(e.span(), "expected a string literal: write the value in quotes, e.g. `database = \"shop\"`").into()
                } else {
                    e
                }
            })
            .collect(),
    )
}
