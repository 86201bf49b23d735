//! The `#[cosmos(...)]` rules of a batch command: the attribute is there; `database`, `container`
//! and `lease` are each given, not blank and valid resource names; `monitored_source` and
//! `lease_source` come as a pair of non-blank opaque tokens. They belong together because they are
//! the keys of the one attribute that says where the command's documents and the relay's leases
//! live, and a missing key is reported on that attribute (only when its syntax parsed).

use darling::util::SpannedValue;

use super::super::attr::{Attr, Command, CosmosArgs};
use super::super::ctxt::Ctxt;
use super::names::{is_a_resource_name, is_not_blank};

/// The command has a `#[cosmos(...)]` attribute.
pub(super) fn cosmos_attribute_is_present<'a>(
    cx: &Ctxt,
    cmd: &'a Command,
) -> Option<&'a Attr<CosmosArgs>> {
    let ident = &cmd.ident;
    if cmd.cosmos.is_none() {
        cx.error(
            ident.span(),
            format!(
                "`{ident}` is missing `#[cosmos(database = \"...\", container = \"...\", lease = \"...\")]`: it names where the command's documents live"
            ),
        );
    }
    cmd.cosmos.as_ref()
}

/// A database, container or lease name: given, non-blank, and a valid Cosmos resource name.
pub(super) fn resource_name(
    cx: &Ctxt,
    cosmos: &Attr<CosmosArgs>,
    value: &Option<SpannedValue<String>>,
    key: &str,
    what: &str,
) -> Option<String> {
    let value = key_is_given(cx, cosmos, value, key, what)?;
    (is_not_blank(cx, value, key, "cosmos") && is_a_resource_name(cx, value, key, "cosmos"))
        .then(|| value.as_str().to_owned())
}

/// A required `#[cosmos]` key is there. When the attribute's syntax was already reported its keys
/// are unknown, and a "missing key" error would only repeat the first error.
fn key_is_given<'a>(
    cx: &Ctxt,
    cosmos: &Attr<CosmosArgs>,
    value: &'a Option<SpannedValue<String>>,
    key: &str,
    what: &str,
) -> Option<&'a SpannedValue<String>> {
    if value.is_none() && cosmos.parsed {
        cx.error(
            cosmos.span,
            format!("`#[cosmos]` is missing `{key} = \"...\"`: {what}"),
        );
    }
    value.as_ref()
}

/// `monitored_source` and `lease_source` come as a pair, each non-blank. A declared identity is an
/// opaque token, not a resource name: any other text is accepted, `/` included.
pub(super) fn declared_source_identity(cx: &Ctxt, cosmos: &CosmosArgs) -> Option<(String, String)> {
    match (&cosmos.monitored_source, &cosmos.lease_source) {
        (Some(monitored), Some(lease)) => {
            let monitored_ok = is_not_blank(cx, monitored, "monitored_source", "cosmos");
            let lease_ok = is_not_blank(cx, lease, "lease_source", "cosmos");
            (monitored_ok && lease_ok)
                .then(|| (monitored.as_str().to_owned(), lease.as_str().to_owned()))
        }
        (Some(only), None) => {
            cx.error(
                only.span(),
                "`monitored_source` needs `lease_source` too: declare both change-feed source identities or neither",
            );
            None
        }
        (None, Some(only)) => {
            cx.error(
                only.span(),
                "`lease_source` needs `monitored_source` too: declare both change-feed source identities or neither",
            );
            None
        }
        (None, None) => None,
    }
}
