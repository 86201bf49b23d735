//! The names serde gives fields, so a partition-key path can be checked against the serialized form.

use syn::{Attribute, LitStr, Token};

/// What serde's attributes say about a field's serialized form.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct FieldSerde {
    /// `rename = "..."` or `rename(serialize = "...")`.
    pub rename: Option<String>,
    /// `skip` or `skip_serializing`: the field never appears in the JSON.
    pub skipped: bool,
    /// `flatten`: the field's own fields appear at the top level instead.
    pub flatten: bool,
}

/// The container's `rename_all` rule (serialize side), if any.
pub(crate) fn container_rename_all(attrs: &[Attribute]) -> Option<String> {
    let mut rule = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        // Malformed serde attributes are serde's to report; ignore what does not parse.
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                rule = serialize_side(&meta)?.or(rule.take());
            } else {
                skip_value(&meta)?;
            }
            Ok(())
        });
    }
    rule
}

/// What serde's attributes say about one field.
pub(crate) fn field(attrs: &[Attribute]) -> FieldSerde {
    let mut out = FieldSerde::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                out.rename = serialize_side(&meta)?.or(out.rename.take());
            } else if meta.path.is_ident("skip") || meta.path.is_ident("skip_serializing") {
                out.skipped = true;
            } else if meta.path.is_ident("flatten") {
                out.flatten = true;
            } else {
                skip_value(&meta)?;
            }
            Ok(())
        });
    }
    out
}

/// `key = "v"` gives `v`; `key(serialize = "v", deserialize = "w")` gives `v`.
fn serialize_side(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
    if meta.input.peek(Token![=]) {
        return Ok(Some(meta.value()?.parse::<LitStr>()?.value()));
    }
    let mut value = None;
    meta.parse_nested_meta(|inner| {
        if inner.path.is_ident("serialize") {
            value = Some(inner.value()?.parse::<LitStr>()?.value());
        } else {
            skip_value(&inner)?;
        }
        Ok(())
    })?;
    Ok(value)
}

/// Consumes whatever follows a key we do not care about.
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<syn::Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _content;
        syn::parenthesized!(_content in meta.input);
    }
    Ok(())
}

/// A field's serialized name: its `rename`, else its identifier under the `rename_all` rule.
pub(crate) fn serialized_name(
    ident: &syn::Ident,
    field: &FieldSerde,
    rename_all: Option<&str>,
) -> String {
    if let Some(name) = &field.rename {
        return name.clone();
    }
    let raw = ident.to_string();
    let name = raw.strip_prefix("r#").unwrap_or(&raw);
    match rename_all {
        Some(rule) => apply_rule(name, rule),
        None => name.to_owned(),
    }
}

/// serde's `RenameRule` applied to a snake_case field name. Unknown rules leave it unchanged
/// (serde reports them itself).
fn apply_rule(field: &str, rule: &str) -> String {
    let pascal = || {
        field
            .split('_')
            .map(|word| {
                let mut chars = word.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                    None => String::new(),
                }
            })
            .collect::<String>()
    };
    match rule {
        "lowercase" => field.to_ascii_lowercase(),
        "UPPERCASE" => field.to_ascii_uppercase(),
        "PascalCase" => pascal(),
        "camelCase" => {
            let p = pascal();
            let mut chars = p.chars();
            match chars.next() {
                Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                None => p,
            }
        }
        "SCREAMING_SNAKE_CASE" => field.to_ascii_uppercase(),
        "kebab-case" => field.replace('_', "-"),
        "SCREAMING-KEBAB-CASE" => field.to_ascii_uppercase().replace('_', "-"),
        _ => field.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn name_of(item: syn::ItemStruct, index: usize) -> String {
        let rule = container_rename_all(&item.attrs);
        let f = item.fields.iter().nth(index).unwrap();
        serialized_name(f.ident.as_ref().unwrap(), &field(&f.attrs), rule.as_deref())
    }

    #[test]
    fn rename_all_camel_case_renames_snake_case_fields() {
        let item = parse_quote! {
            #[serde(rename_all = "camelCase")]
            struct S { order_id: String }
        };
        assert_eq!(name_of(item, 0), "orderId");
    }

    #[test]
    fn field_rename_wins_over_rename_all() {
        let item = parse_quote! {
            #[serde(rename_all = "camelCase")]
            struct S { #[serde(rename = "tenant")] tenant_id: String }
        };
        assert_eq!(name_of(item, 0), "tenant");
    }

    #[test]
    fn serialize_side_of_split_rename_is_used() {
        let item = parse_quote! {
            #[serde(deny_unknown_fields, rename_all(deserialize = "snake_case", serialize = "PascalCase"))]
            struct S { #[serde(default, with = "x")] order_id: String }
        };
        assert_eq!(name_of(item, 0), "OrderId");
    }

    #[test]
    fn every_serde_rule_is_applied() {
        for (rule, expected) in [
            ("lowercase", "order_id"),
            ("UPPERCASE", "ORDER_ID"),
            ("PascalCase", "OrderId"),
            ("camelCase", "orderId"),
            ("snake_case", "order_id"),
            ("SCREAMING_SNAKE_CASE", "ORDER_ID"),
            ("kebab-case", "order-id"),
            ("SCREAMING-KEBAB-CASE", "ORDER-ID"),
        ] {
            assert_eq!(apply_rule("order_id", rule), expected, "{rule}");
        }
    }

    #[test]
    fn raw_identifiers_lose_their_prefix() {
        let item = parse_quote! { struct S { r#type: String } };
        assert_eq!(name_of(item, 0), "type");
    }

    #[test]
    fn skip_and_flatten_are_seen() {
        let f = field(&[parse_quote!(#[serde(skip_serializing)])]);
        assert!(f.skipped);
        let f = field(&[parse_quote!(#[serde(flatten)])]);
        assert!(f.flatten);
    }
}
