//! The serialized form of Chatter-authored bodies: `ChatterJson.Options` parity.
//!
//! The C# writes compact JSON, keys in insertion order, with an encoder that leaves `+ < > & ' /`
//! and every non-ASCII character literal. It escapes `"` as `\"`, `\` as `\\`, the C0 controls
//! with a short form as `\b \t \n \f \r`, and every other C0 control and DEL (U+007F) as
//! `\u00XX` with UPPERCASE hex (`UnsafeRelaxedJsonEscaping` is the inner encoder; DEL is not a
//! "defined" character for it). serde_json differs in two places: lowercase hex, and DEL left
//! literal. [`ChatterJsonFormatter`] closes both, so the bytes match.
//!
//! Known remaining difference: floating-point numbers (`1e20` here, `1E+20` in .NET). Chatter
//! writes no floats itself; only a float an application puts in a message context is affected,
//! and readers parse JSON rather than compare bytes.

use std::io;

use serde::Serialize;
use serde_json::Value;
use serde_json::ser::{CharEscape, Formatter};
use time::{OffsetDateTime, UtcOffset};

use super::DocumentError;

/// A compact serde_json formatter with `ChatterJson.Options` escaping (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ChatterJsonFormatter;

const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

impl Formatter for ChatterJsonFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let mut rest = fragment;
        while let Some(at) = rest.find('\u{7f}') {
            writer.write_all(&rest.as_bytes()[..at])?;
            writer.write_all(b"\\u007F")?;
            rest = &rest[at + 1..];
        }
        writer.write_all(rest.as_bytes())
    }

    fn write_char_escape<W>(&mut self, writer: &mut W, char_escape: CharEscape) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let short: &[u8] = match char_escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            // serde_json never asks for an escaped solidus; .NET would leave it literal too.
            CharEscape::Solidus => b"/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(byte) => {
                let hex = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX_UPPER[usize::from(byte >> 4)],
                    HEX_UPPER[usize::from(byte & 0xF)],
                ];
                return writer.write_all(&hex);
            }
        };
        writer.write_all(short)
    }
}

/// Serializes `value` as `ChatterJson.Options` would: compact, insertion-ordered keys, minimal
/// escaping (see the module docs). These are the bytes Chatter hands the store.
pub(crate) fn to_json_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, ChatterJsonFormatter);
    // Serializing a `Value` into a `Vec` cannot fail: object keys are strings, numbers are
    // finite, and the writer is infallible. Keep a well-formed body even so.
    if value.serialize(&mut serializer).is_err() {
        out.clear();
        out.extend_from_slice(b"null");
    }
    out
}

/// [`to_json_vec`] as a string.
pub(crate) fn to_json_string(value: &Value) -> String {
    // The formatter writes whole `&str` fragments and ASCII escapes only: always UTF-8.
    String::from_utf8(to_json_vec(value))
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Renders an instant as System.Text.Json renders a UTC `DateTime`: ISO-8601, `Z`, up to seven
/// fractional digits (100 ns ticks, truncated) with trailing zeros trimmed, no fraction at all on
/// a whole second. E.g. `2026-06-15T00:00:00.1234567Z`, `2026-06-15T00:00:00.5Z`,
/// `2026-06-15T00:00:00Z`.
///
/// # Errors
/// [`DocumentError::TimestampOutOfRange`] outside the years 0001–9999 (after conversion to UTC).
pub(crate) fn format_utc_timestamp(instant: OffsetDateTime) -> Result<String, DocumentError> {
    let utc = instant.checked_to_offset(UtcOffset::UTC);
    let Some(utc) = utc.filter(|t| (1..=9999).contains(&t.year())) else {
        return Err(DocumentError::TimestampOutOfRange {
            timestamp: instant.to_string(),
        });
    };
    let mut text = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        utc.year(),
        u8::from(utc.month()),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second()
    );
    let ticks = utc.nanosecond() / 100;
    if ticks != 0 {
        let fraction = format!("{ticks:07}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    // 0 intro: the encoder leaves `+ < > & ' /` and all non-ASCII literal.
    #[test]
    fn html_sensitive_ascii_and_non_ascii_stay_literal() {
        let value = json!({"k": "+<>&'/ éü😀 \u{2028} \u{85} 中文"});
        assert_eq!(
            to_json_string(&value),
            "{\"k\":\"+<>&'/ éü😀 \u{2028} \u{85} 中文\"}"
        );
    }

    #[test]
    fn quote_backslash_and_controls_are_escaped_like_chatter_json() {
        let value = json!("\"\\\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{1b}\u{7f}x");
        assert_eq!(
            to_json_string(&value),
            r#""\"\\\b\f\n\r\t\u0000\u001F\u001B\u007Fx""#
        );
    }

    #[test]
    fn output_is_compact_with_insertion_ordered_keys() {
        let mut map = serde_json::Map::new();
        map.insert("z".into(), json!(1));
        map.insert("a".into(), json!([true, null, {"y": 2, "b": "c"}]));
        assert_eq!(
            to_json_string(&Value::Object(map)),
            r#"{"z":1,"a":[true,null,{"y":2,"b":"c"}]}"#
        );
    }

    // 0.3: ISO-8601 round-trip form, `Z`, <=7 fractional digits, trailing zeros trimmed.
    #[test]
    fn timestamps_render_like_system_text_json_utc_datetime() {
        let cases = [
            (
                datetime!(2026-06-15 00:00:00.1234567 UTC),
                "2026-06-15T00:00:00.1234567Z",
            ),
            (datetime!(2026-06-15 00:00:00 UTC), "2026-06-15T00:00:00Z"),
            (
                datetime!(2026-06-15 00:00:00.5 UTC),
                "2026-06-15T00:00:00.5Z",
            ),
            (
                datetime!(2026-06-15 00:00:00.120 UTC),
                "2026-06-15T00:00:00.12Z",
            ),
            (
                datetime!(2026-06-15 00:00:00.0000001 UTC),
                "2026-06-15T00:00:00.0000001Z",
            ),
            // Sub-tick nanoseconds are truncated (a .NET DateTime has 100 ns ticks).
            (
                datetime!(2026-06-15 00:00:00.000000099 UTC),
                "2026-06-15T00:00:00Z",
            ),
            (
                datetime!(2026-06-15 23:59:59.123456789 UTC),
                "2026-06-15T23:59:59.1234567Z",
            ),
            (datetime!(0001-01-01 00:00:00 UTC), "0001-01-01T00:00:00Z"),
            (
                datetime!(9999-12-31 23:59:59.9999999 UTC),
                "9999-12-31T23:59:59.9999999Z",
            ),
        ];
        for (instant, expected) in cases {
            assert_eq!(format_utc_timestamp(instant).unwrap(), expected);
        }
    }

    #[test]
    fn timestamps_with_an_offset_are_converted_to_utc() {
        let instant = datetime!(2026-06-15 02:30:00.25 +02:00);
        assert_eq!(
            format_utc_timestamp(instant).unwrap(),
            "2026-06-15T00:30:00.25Z"
        );
    }

    #[test]
    fn timestamps_outside_years_1_to_9999_are_errors() {
        assert!(matches!(
            format_utc_timestamp(datetime!(0000-12-31 23:00:00 UTC)),
            Err(DocumentError::TimestampOutOfRange { .. })
        ));
        // Year 1 in +02:00 is year 0 in UTC.
        assert!(format_utc_timestamp(datetime!(0001-01-01 01:00:00 +02:00)).is_err());
    }
}
