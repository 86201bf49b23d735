//! What the commands print: tables for people, JSON for scripts.

use std::time::{SystemTime, UNIX_EPOCH};

use chatter_runtime::operator::{LeaseServed, LeaseView, OutboxSurvey};

pub(crate) fn print<T: serde::Serialize + ?Sized>(json: bool, survey: &T, table: fn(&T) -> String) {
    if json {
        match serde_json::to_string_pretty(survey) {
            Ok(text) => println!("{text}"),
            Err(error) => eprintln!("chatter: cannot write JSON: {error}"),
        }
    } else {
        print!("{}", table(survey));
    }
}

pub(crate) fn pending_table(survey: &OutboxSurvey) -> String {
    let relayed = if survey.pending.is_empty() {
        "no pending outbox documents\n".to_owned()
    } else {
        let now = now();
        let mut rows = vec![[
            "DESTINATION".to_owned(),
            "PENDING".to_owned(),
            "OLDEST WRITTEN".to_owned(),
            "OLDEST MESSAGE ID".to_owned(),
        ]];
        for (destination, pending) in &survey.pending {
            rows.push([
                destination.clone(),
                pending.count.to_string(),
                pending
                    .oldest_written_at
                    .map_or_else(|| "?".to_owned(), |at| when(at, now)),
                pending.oldest_message_id.clone().unwrap_or_default(),
            ]);
        }
        format!(
            "{}{} pending in all\n",
            columns(&rows),
            survey.pending_count()
        )
    };
    relayed + &id_mismatches_table(survey)
}

/// The documents that look pending but are never relayed (their id is not the outbox id of
/// their message id), listed apart with the id each should have; empty when there are none.
fn id_mismatches_table(survey: &OutboxSurvey) -> String {
    if survey.id_mismatches.is_empty() {
        return String::new();
    }
    let mut rows = vec![[
        "ID".to_owned(),
        "MESSAGE ID".to_owned(),
        "EXPECTED ID".to_owned(),
        "DESTINATION".to_owned(),
    ]];
    for doc in &survey.id_mismatches {
        rows.push([
            doc.id.clone(),
            doc.message_id.clone(),
            doc.expected_id
                .clone()
                .unwrap_or_else(|| "none (no usable MessageId)".to_owned()),
            doc.destination.clone(),
        ]);
    }
    format!(
        "\n{} document(s) look pending but are never relayed: an Outbox Document's id must be \
         `outbox:` and the unpadded base64url of its MessageId; write each again under its \
         expected id:\n{}",
        survey.id_mismatches.len(),
        columns(&rows)
    )
}

pub(crate) fn undeliverable_table(survey: &OutboxSurvey) -> String {
    if survey.undeliverable.is_empty() {
        return "no undeliverable outbox documents\n".to_owned();
    }
    let now = now();
    let mut rows = vec![[
        "MESSAGE ID".to_owned(),
        "DESTINATION".to_owned(),
        "STAMPED".to_owned(),
        "WHY".to_owned(),
    ]];
    for doc in &survey.undeliverable {
        rows.push([
            doc.message_id.clone(),
            doc.destination.clone(),
            doc.stamped_at
                .map_or_else(|| "?".to_owned(), |at| when(at, now)),
            if let Some(reason) = &doc.operator_reason {
                format!("given up by an operator: {reason}")
            } else if doc.violations.is_empty() {
                "none now (it passes the contract)".to_owned()
            } else {
                doc.violations.join("; ")
            },
        ]);
    }
    format!(
        "{}{} undeliverable\n",
        columns(&rows),
        survey.undeliverable.len()
    )
}

pub(crate) fn leases_table(leases: &[LeaseView]) -> String {
    if leases.is_empty() {
        return "no leases\n".to_owned();
    }
    let now = now();
    let mut rows = vec![[
        "PROCESSOR".to_owned(),
        "LEASE".to_owned(),
        "OWNER".to_owned(),
        "LAST WRITTEN".to_owned(),
        "CHECKPOINTED".to_owned(),
        "BACKLOG".to_owned(),
        "STATE".to_owned(),
    ]];
    for lease in leases {
        rows.push([
            lease.processor.clone(),
            lease.lease_token.clone(),
            lease.owner.clone().unwrap_or_else(|| "-".to_owned()),
            lease
                .last_written_at
                .map_or_else(|| "?".to_owned(), |at| when(at, now)),
            if lease.checkpointed { "yes" } else { "no" }.to_owned(),
            lease
                .backlog
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            match (lease.state, lease.suspended) {
                (LeaseServed::Owned, true) => {
                    "SUSPENDED (Drain Suspension: its stamps keep failing)"
                }
                (LeaseServed::Owned, false) => "owned",
                (LeaseServed::Expired, _) => "EXPIRED (its owner stopped writing it)",
                (LeaseServed::Free, _) => "FREE (no relay serves it)",
            }
            .to_owned(),
        ]);
    }
    let unserved = leases
        .iter()
        .filter(|lease| lease.state != LeaseServed::Owned || lease.suspended)
        .count();
    format!(
        "{}{} leases, {unserved} not served\n",
        columns(&rows),
        leases.len()
    )
}

/// Left-aligned columns, two spaces apart (the last one unpadded).
pub(crate) fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0; N];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (at, cell) in row.iter().enumerate() {
            if at + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[at]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A Cosmos `_ts` as UTC time and age, e.g. `2026-12-02T17:20:01Z (4m 12s ago)`.
pub(crate) fn when(at: i64, now: i64) -> String {
    let stamp = time::OffsetDateTime::from_unix_timestamp(at)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| at.to_string());
    let age = now.saturating_sub(at).max(0);
    let age = match age {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m {}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h {}m", s / 3_600, (s % 3_600) / 60),
        s => format!("{}d {}h", s / 86_400, (s % 86_400) / 3_600),
    };
    format!("{stamp} ({age} ago)")
}
