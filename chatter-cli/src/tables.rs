//! What the commands print: tables for people, JSON for scripts.

use std::time::{SystemTime, UNIX_EPOCH};

use chatter_runtime::operator::{
    LeaseServed, LeaseView, MessageSource, OutboxSurvey, relay_instance,
};

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
            } else if survey.message_source == MessageSource::BodyResolver {
                "not checked (a body resolver builds its message)".to_owned()
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
    // One heading per processor (its name is some 70 characters, the same on every row of it),
    // then its leases: the table stays within 150 columns instead of 250.
    let mut processors: Vec<&str> = leases.iter().map(|l| l.processor.as_str()).collect();
    processors.sort_unstable();
    processors.dedup();
    let mut out = String::new();
    let mut states = Vec::new();
    for processor in processors {
        // The lease token last, whole (two 32-digit bounds: a cut one could not be found in
        // the relay's logs).
        let mut rows = vec![[
            "OWNER".to_owned(),
            "LAST WRITTEN".to_owned(),
            "CHECKPOINTED".to_owned(),
            "BACKLOG".to_owned(),
            "STATE".to_owned(),
            "LEASE".to_owned(),
        ]];
        let mut of: Vec<&LeaseView> = leases.iter().filter(|l| l.processor == processor).collect();
        of.sort_by(|a, b| a.lease_token.cmp(&b.lease_token));
        for lease in &of {
            let state = match (lease.state, lease.suspended) {
                (LeaseServed::Owned, true) => "SUSPENDED",
                (LeaseServed::Owned, false) => "owned",
                (LeaseServed::Expired, _) => "EXPIRED",
                (LeaseServed::Free, _) => "FREE",
            };
            if !states.contains(&state) {
                states.push(state);
            }
            rows.push([
                lease.owner.as_deref().map_or_else(|| "-".to_owned(), owner),
                lease
                    .last_written_at
                    .map_or_else(|| "?".to_owned(), |at| when(at, now)),
                if lease.checkpointed { "yes" } else { "no" }.to_owned(),
                lease
                    .backlog
                    .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                state.to_owned(),
                lease.lease_token.clone(),
            ]);
        }
        out.push_str(&format!(
            "processor {processor} ({})\n",
            counted(of.len(), "lease", "leases")
        ));
        for line in columns(&rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    let unserved = leases
        .iter()
        .filter(|lease| lease.state != LeaseServed::Owned || lease.suspended)
        .count();
    out.push_str(&format!(
        "{}, {unserved} not served\n",
        counted(leases.len(), "lease", "leases")
    ));
    // What the states that appear mean, once, below the table.
    for (state, meaning) in [
        (
            "EXPIRED",
            "its owner stopped writing it for longer than the expiry",
        ),
        ("FREE", "no relay serves its range"),
        (
            "SUSPENDED",
            "its owner holds it under a Drain Suspension: its stamps keep failing",
        ),
    ] {
        if states.contains(&state) {
            out.push_str(&format!("{state}: {meaning}\n"));
        }
    }
    out
}

/// An owner as the table shows it: a relay's instance name
/// (`chatter-cosmos-outbox-relay:{machine}:{uuid}`) as its machine and the uuid's first 8
/// characters, enough to tell instances apart (`--json` has it whole); any other name as it is.
fn owner(name: &str) -> String {
    relay_instance(name).map_or_else(
        || name.to_owned(),
        |(machine, id)| format!("{machine}:{}…", &id[..8]),
    )
}

/// The widest a cell before a table's last column is shown: longer ones are cut (`…`), so one
/// long reason does not push the other columns off the screen (`--json` has them whole).
pub(crate) const MAX_CELL: usize = 60;

/// `n` and the noun, singular for one.
pub(crate) fn counted(n: usize, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// Left-aligned columns, two spaces apart (the last one unpadded).
pub(crate) fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let cut = |cell: &String| -> String {
        if cell.chars().count() > MAX_CELL {
            let kept: String = cell.chars().take(MAX_CELL - 1).collect();
            format!("{kept}…")
        } else {
            cell.clone()
        }
    };
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|row| {
            std::array::from_fn(|at| {
                if at + 1 == N {
                    row[at].clone()
                } else {
                    cut(&row[at])
                }
            })
        })
        .collect();
    let mut widths = [0; N];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_cell_before_the_last_column_is_cut_so_the_columns_stay_readable() {
        let long = "x".repeat(200);
        let table = columns(&[
            ["A".to_owned(), "B".to_owned()],
            [long.clone(), "end".to_owned()],
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].chars().count() <= MAX_CELL + 2 + 3, "{table}");
        assert!(lines[1].contains('…'), "{table}");
        assert!(lines[1].ends_with("end"), "{table}");
        assert_eq!(
            columns(&[["a".to_owned(), long.clone()]]).trim_end(),
            format!("a  {long}")
        );
    }

    #[test]
    fn a_relays_instance_name_shows_as_its_machine_and_the_start_of_its_id() {
        assert_eq!(
            owner("chatter-cosmos-outbox-relay:web-7:3f2a9c1e-0b6d-4c1e-9f3a-2d5e8b7c6a10"),
            "web-7:3f2a9c1e…"
        );
        assert_eq!(owner("host-1"), "host-1");
        assert_eq!(
            owner("chatter-cosmos-outbox-relay:web-7:x"),
            "chatter-cosmos-outbox-relay:web-7:x"
        );
    }

    #[test]
    fn one_of_a_kind_reads_singular() {
        assert_eq!(counted(1, "document", "documents"), "1 document");
        assert_eq!(counted(0, "document", "documents"), "0 documents");
        assert_eq!(counted(2, "dead letter", "dead letters"), "2 dead letters");
    }
}
