//! Every crate's modules stand in floors, each importing only from the floors below it, and its
//! own code names a thing where it lives, never through the crate root's re-exports (which are
//! the users' door, not the house's stairs). This test reads the sources as text: doc comments
//! and comment lines are left out, as they are links for readers, not imports.
//!
//! Files of one folder import each other in no circle either, and ARCHITECTURE.md's table says
//! what each module of `chatter-runtime` imports, as the code does. Run it alone with
//! `cargo test -p chatter-tests --test layering`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate of the workspace: its folder, its crate roots (which may import anything, and which
/// nothing imports), its floors (ground first: a module may use the modules of lower floors and
/// its own), and names its root re-exports (to show they are read).
struct Crate {
    dir: &'static str,
    roots: &'static [&'static str],
    floors: &'static [&'static [&'static str]],
    exports: &'static [&'static str],
}

const RUNTIME: Crate = Crate {
    dir: "chatter-runtime",
    roots: &["lib.rs"],
    floors: RUNTIME_FLOORS,
    exports: &["Runtime", "Rejection"],
};

/// The runtime's floors.
const RUNTIME_FLOORS: &[&[&str]] = &[
    &[
        "message",
        "error_chain",
        "backoff",
        "partition_key",
        "deadline",
        "clock",
        "state",
    ],
    &["document"],
    &["broker", "cosmos"],
    &["telemetry"],
    &["handler_context"],
    &["registry"],
    &["relay", "inbox"],
    &["pipeline"],
    &["runtime"],
    // Faces and tools over everything: the public modules that gather what lives below (errors,
    // health, constants), provisioning, the operator's queries, the test
    // seams.
    &[
        "error",
        "error_report",
        "constants",
        "health",
        "provision",
        "operator",
        "testing",
    ],
];

/// Every crate of the workspace with code of its own (the tests and examples import what they
/// check or show).
const CRATES: &[Crate] = &[
    RUNTIME,
    Crate {
        dir: "cosmos-change-feed",
        roots: &["lib.rs"],
        floors: &[
            &["backoff", "balance", "ranges", "request", "testing"],
            &["store"],
            &["error"],
            &["options", "fault"],
            &["lease", "page"],
            // What the batch handler is handed: the workers hand it over.
            &["batch"],
            &["worker"],
            &["coordinator"],
            &["estimator"],
        ],
        exports: &["ChangeFeedBatch", "LeaseLost"],
    },
    Crate {
        dir: "chatter-cli",
        roots: &["main.rs"],
        // The commands share the account flags, the brokers and the tables; none imports
        // `main.rs`, which only dispatches.
        floors: &[&["failure"], &["tables", "broker", "store"], &["commands"]],
        exports: &[],
    },
    Crate {
        dir: "chatter-macros",
        roots: &["lib.rs"],
        floors: &[&["internals"]],
        exports: &[],
    },
    Crate {
        dir: "chatter-emulator",
        // The library and the binary that serves it: two crates of one file each.
        roots: &["lib.rs", "main.rs"],
        floors: &[],
        exports: &[],
    },
];

/// Every source file of `krate`: its path under `src/` (with `/`) and its text.
fn source_files(krate: &Crate) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate.dir)
        .join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .iter()
        .map(|file| {
            let relative = file
                .strip_prefix(&root)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(file).expect("a source file");
            (relative, text)
        })
        .collect()
}

/// `relay/drain.rs` -> `relay`; `state.rs` -> `state`; `lib.rs` -> `lib`.
fn top_module(relative: &str) -> &str {
    let first = relative.split('/').next().expect("a path");
    first.strip_suffix(".rs").unwrap_or(first)
}

fn floor_of(floors: &[&[&str]], module: &str) -> Option<usize> {
    floors.iter().position(|floor| floor.contains(&module))
}

/// The file's code lines: comment lines and `#[cfg(test)]` modules left out (a unit test may
/// build what it checks from anywhere), each with its number.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let mut test_attribute = false;
    let mut test_depth = 0usize;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if test_depth > 0 {
            test_depth += trimmed.matches('{').count();
            test_depth = test_depth.saturating_sub(trimmed.matches('}').count());
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]") {
            test_attribute = true;
            continue;
        }
        if test_attribute && trimmed.starts_with("mod ") && trimmed.ends_with('{') {
            test_depth = 1;
            test_attribute = false;
            continue;
        }
        test_attribute = false;
        if !trimmed.starts_with("//") {
            lines.push((number + 1, line));
        }
    }
    lines
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The first name after every `prefix` (such as `crate::` or `super::`) in the file's code,
/// each name of a `{a::B, c}` group after it too, with its line number.
fn names_after(text: &str, prefix: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in code_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + prefix.len()..];
            // Not `$crate::` or `foo_crate::`, nor `super::` inside `self::super::`.
            if before.is_some_and(|c| is_ident(c) || c == '$') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1usize;
                let mut start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 1 => break,
                        '}' => depth -= 1,
                        ',' if depth == 1 => start = true,
                        c if start && is_ident(c) => {
                            let name: String =
                                group[i..].chars().take_while(|c| is_ident(*c)).collect();
                            found.push((number, name));
                            start = false;
                        }
                        c if !c.is_whitespace() => start = false,
                        _ => {}
                    }
                }
                continue;
            }
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                found.push((number, name));
            }
        }
    }
    found
}

/// The names `lib.rs` re-exports with `pub use` (the root's public surface).
fn root_reexports(lib: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_use = false;
    let mut depth = 0usize;
    for line in lib.lines() {
        let trimmed = line.trim();
        if depth == 0 && trimmed.starts_with("pub mod ") && trimmed.ends_with('{') {
            // `pub mod registration { ... }`: its re-exports are the module's, not the root's.
            depth = 1;
            continue;
        }
        if depth > 0 {
            depth += trimmed.matches('{').count();
            depth -= trimmed.matches('}').count();
            continue;
        }
        if trimmed.starts_with("pub use ") {
            in_use = true;
        }
        if in_use {
            let body = trimmed.trim_start_matches("pub use ");
            let listed = body.rsplit("::{").next().unwrap_or(body);
            let listed = if body.contains('{') || !body.contains("::") {
                listed
            } else {
                body.rsplit("::").next().unwrap_or(body)
            };
            for name in listed.split(',') {
                let name = name.trim().trim_end_matches(['}', ';']).trim();
                if !name.is_empty() && name.chars().all(is_ident) {
                    names.insert(name.to_owned());
                }
            }
            if trimmed.ends_with(';') {
                in_use = false;
            }
        }
    }
    names
}

#[test]
fn no_module_imports_from_a_floor_above_it_and_none_names_a_thing_through_the_crate_root() {
    let mut through_root = Vec::new();
    let mut upward = BTreeSet::new();
    let mut from_root = Vec::new();
    for krate in CRATES {
        let files = source_files(krate);
        let mut reexports = BTreeSet::new();
        for (_, root) in files
            .iter()
            .filter(|(f, _)| krate.roots.contains(&f.as_str()))
        {
            reexports.extend(root_reexports(root));
        }
        for name in krate.exports {
            assert!(
                reexports.contains(*name),
                "{}: the root's re-exports are read: {reexports:?}",
                krate.dir
            );
        }
        for (relative, text) in &files {
            if krate.roots.contains(&relative.as_str()) {
                continue;
            }
            let module = top_module(relative);
            let floor = floor_of(krate.floors, module).unwrap_or_else(|| {
                panic!(
                    "{}/src/{relative}: module `{module}` is on no floor (tests/tests/layering.rs)",
                    krate.dir
                )
            });
            for (line, name) in names_after(text, "crate::") {
                let at = format!("{}/src/{relative}:{line}: crate::{name}", krate.dir);
                if reexports.contains(&name) {
                    through_root.push(at);
                    continue;
                }
                if name == module || name == "__private" {
                    continue;
                }
                match floor_of(krate.floors, &name) {
                    Some(target) if target >= floor => {
                        upward.insert(format!("{}: {relative} -> {name}", krate.dir));
                    }
                    Some(_) => {}
                    // Not a module: an item of the crate root itself, which stands above all.
                    None => from_root.push(at),
                }
            }
        }
    }

    assert!(
        through_root.is_empty(),
        "name these where they are defined, not through the crate root's re-exports:\n{}",
        through_root.join("\n")
    );
    assert!(
        upward.is_empty(),
        "imports that run upward (or sideways on one floor): {upward:?}"
    );
    assert!(
        from_root.is_empty(),
        "items of a crate root, imported by its modules (the root imports them, not the other \
         way):\n{}",
        from_root.join("\n")
    );
}

/// The files of one folder import each other in no circle: `super::x` and
/// `crate::folder::x` from a sibling file of `x.rs` are the arrows.
#[test]
fn no_files_of_one_folder_import_each_other_in_a_circle() {
    // Arrows between files named `{crate dir}/{path under src}`.
    let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for krate in CRATES {
        let files = source_files(krate);
        let paths: BTreeSet<&str> = files
            .iter()
            .map(|(relative, _)| relative.as_str())
            .collect();
        for (path, text) in &files {
            let Some((folder, stem)) = path.rsplit_once('/') else {
                continue; // a file of the crate root: its siblings are the floors above
            };
            if stem == "mod.rs" {
                continue;
            }
            let sibling = |name: &str| {
                let candidate = format!("{folder}/{name}.rs");
                (name != stem.trim_end_matches(".rs") && paths.contains(candidate.as_str()))
                    .then(|| format!("{}/{candidate}", krate.dir))
            };
            let folder_path = format!("crate::{}::", folder.replace('/', "::"));
            let targets = names_after(text, "super::")
                .into_iter()
                .chain(names_after(text, &folder_path))
                .filter_map(|(_, name)| sibling(&name));
            arrows
                .entry(format!("{}/{path}", krate.dir))
                .or_default()
                .extend(targets);
        }
    }

    // Depth-first: a file met again while it is still on the path closes a circle.
    fn visit(
        file: &str,
        arrows: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|f| f == file) {
            let mut circle = path[at..].to_vec();
            circle.push(file.to_owned());
            return Some(circle);
        }
        if done.contains(file) {
            return None;
        }
        path.push(file.to_owned());
        for next in arrows.get(file).into_iter().flatten() {
            if let Some(circle) = visit(next, arrows, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(file.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for file in arrows.keys() {
        let circle = visit(file, &arrows, &mut Vec::new(), &mut done);
        assert!(
            circle.is_none(),
            "files that import each other in a circle: {}",
            circle.unwrap_or_default().join(" -> ")
        );
    }
    for (from, to) in [
        (
            "chatter-runtime/relay/drain.rs",
            "chatter-runtime/relay/dispatch.rs",
        ),
        (
            "chatter-macros/internals/check/inbox.rs",
            "chatter-macros/internals/check/routing.rs",
        ),
    ] {
        assert!(
            arrows.get(from).is_some_and(|arrows| arrows.contains(to)),
            "the arrows are read: {from} -> {to} in {arrows:?}"
        );
    }
}

/// The crate root is what a handler and a `main` write; everything else has a module (issue:
/// the root had grown to 42 names; it has 15). A name added here belongs in CHANGELOG.md and the landing
/// page's module table.
#[test]
fn the_crate_root_exports_only_what_a_handler_and_a_main_write() {
    let files = source_files(&RUNTIME);
    let (_, lib) = files
        .iter()
        .find(|(relative, _)| relative == "lib.rs")
        .expect("lib.rs");
    let expected: BTreeSet<String> = [
        "start",
        "Runtime",
        "RuntimeBuilder",
        "Report",
        "HandlerContext",
        "BrokeredMessage",
        "Rejection",
        "Outcome",
        "State",
        "ETag",
        "Versioned",
        "Query",
        "BoxError",
        "DocumentReliable",
        "handler",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(root_reexports(lib), expected);
}

/// ARCHITECTURE.md's table of folders and files says what each imports; held to the code both
/// ways: an import the table does not list fails, and so does a listed one the code no longer
/// has. A row of several files lists what they import together, from outside the row.
#[test]
fn architecture_lists_what_each_module_imports_and_nothing_else() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md");
    let architecture = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let backticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(|name| {
                name.trim_end_matches('/')
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .collect()
    };
    // The rows after the header of the folders table: (modules, imports listed).
    let mut rows: Vec<(Vec<String>, BTreeSet<String>)> = Vec::new();
    let mut in_table = false;
    for line in architecture.lines() {
        if line.starts_with("| folder / file |") {
            in_table = true;
            continue;
        }
        if !in_table || line.starts_with("| ---") {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        assert_eq!(cells.len(), 3, "a row of three cells: {line}");
        let modules = backticked(cells[0]);
        // Module names and the change-feed crate; the SDK and the types named in passing are
        // not checked.
        let listed = backticked(cells[2])
            .into_iter()
            .filter(|name| floor_of(RUNTIME_FLOORS, name).is_some() || name == "cosmos-change-feed")
            .collect();
        rows.push((modules, listed));
    }
    assert!(rows.len() > 10, "the table is read: {rows:?}");

    let mut imported: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (relative, text) in source_files(&RUNTIME) {
        let module = top_module(&relative).to_owned();
        if module == "lib" {
            continue;
        }
        let mut names: BTreeSet<String> = names_after(&text, "crate::")
            .into_iter()
            .map(|(_, name)| name)
            .filter(|name| floor_of(RUNTIME_FLOORS, name).is_some())
            .collect();
        if !names_after(&text, "cosmos_change_feed::").is_empty()
            || code_lines(&text)
                .iter()
                .any(|(_, line)| line.contains("use cosmos_change_feed"))
        {
            names.insert("cosmos-change-feed".to_owned());
        }
        imported.entry(module).or_default().extend(names);
    }

    let mut wrong = Vec::new();
    let mut tabled = BTreeSet::new();
    for (modules, listed) in &rows {
        tabled.extend(modules.iter().cloned());
        let actual: BTreeSet<String> = modules
            .iter()
            .flat_map(|module| imported.get(module).cloned().unwrap_or_default())
            .filter(|name| !modules.contains(name))
            .collect();
        let unlisted: Vec<_> = actual.difference(listed).collect();
        let stale: Vec<_> = listed.difference(&actual).collect();
        if !unlisted.is_empty() || !stale.is_empty() {
            wrong.push(format!(
                "{modules:?}: imports {unlisted:?} it does not list; lists {stale:?} it does not import"
            ));
        }
    }
    let untabled: Vec<_> = imported.keys().filter(|m| !tabled.contains(*m)).collect();
    assert!(
        untabled.is_empty(),
        "modules without a row in ARCHITECTURE.md: {untabled:?}"
    );
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's imports column:\n{}",
        wrong.join("\n")
    );
}
