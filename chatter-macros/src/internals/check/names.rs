//! The naming rules every attribute shares: a name given as a string is not empty or only
//! whitespace, and a name that becomes a Cosmos DB resource or a broker name holds none of the
//! characters Cosmos DB forbids in a resource name. `#[cosmos]`, `#[inbox]` and `#[chatter]` all
//! call them (the declared source identities only the first), so they live apart from any one
//! attribute; each message names the attribute and the key it judges.

use darling::util::SpannedValue;

use super::super::ctxt::Ctxt;

/// A name is not empty and not only whitespace.
pub(super) fn is_not_blank(cx: &Ctxt, value: &SpannedValue<String>, key: &str, attr: &str) -> bool {
    let blank = value.trim().is_empty();
    if blank {
        cx.error(
            value.span(),
            format!("`#[{attr}({key} = ...)]` must not be empty or whitespace"),
        );
    }
    !blank
}

/// A name holds none of the characters Cosmos DB forbids in a resource name.
pub(super) fn is_a_resource_name(
    cx: &Ctxt,
    value: &SpannedValue<String>,
    key: &str,
    attr: &str,
) -> bool {
    let forbidden = value.chars().find(|c| matches!(c, '/' | '\\' | '?' | '#'));
    if let Some(c) = forbidden {
        cx.error(
            value.span(),
            format!(
                "`#[{attr}({key} = ...)]` contains `{c}`, which Cosmos DB does not allow in a resource name"
            ),
        );
    }
    forbidden.is_none()
}
