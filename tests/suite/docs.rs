//! The documents against the code: in, README.md, ARCHITECTURE.md, docs/ and the files under
//! src/; out, a failure naming what went stale and the command or edit that brings it back.
//! docs/flags.md must be what `gpen-video help-markdown` writes today, ARCHITECTURE.md must name
//! every source file, the import graph keeps no circle and at most ten floors, README stays
//! short, and every relative link in the documents leads to a file (and a heading, where it
//! names one) that exists.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;

/// The command that refreshes docs/flags.md, as the failure tells it.
const REFRESH: &str = "cargo run --release -- help-markdown > docs/flags.md";

#[test]
fn the_flag_reference_is_what_the_command_line_declares() {
    let out = gpen_plain(&[&"help-markdown"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let made = String::from_utf8(out.stdout).expect("the flag reference is UTF-8");
    let kept = std::fs::read_to_string(root().join("docs/flags.md"))
        .unwrap_or_else(|e| panic!("docs/flags.md cannot be read ({e}): make it with `{REFRESH}`"));
    if made != kept {
        let line = made
            .lines()
            .zip(kept.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(made.lines().count().min(kept.lines().count()));
        panic!(
            "docs/flags.md is stale (first difference at line {}: the command line now says {:?}): \
             refresh it with `{REFRESH}` and commit it",
            line + 1,
            made.lines().nth(line).unwrap_or("(nothing)")
        );
    }
}

/// Every file under `dir`, as paths relative to the repository's root with `/` between parts.
fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.unwrap();
        if entry.file_type().is_file() {
            let rel = entry.path().strip_prefix(root()).unwrap();
            found.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    found
}

#[test]
fn the_architecture_names_every_source_file() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let missing: Vec<String> = files_under(&root().join("src"))
        .into_iter()
        .filter(|path| !text.contains(path.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name {missing:?}: add a line for each, with its full path from src/, \
         saying what goes in and what comes out"
    );
}

/// The most floors the import graph may stand on (ARCHITECTURE.md draws them).
const FLOORS: usize = 10;

/// The room a source file is in: a file directly under src/ is its own; a file deeper is its
/// top folder's (`src/faces/`), as ARCHITECTURE.md's graph counts them.
fn room_of(path: &str) -> String {
    match path.trim_start_matches("src/").split_once('/') {
        Some((folder, _)) => format!("src/{folder}/"),
        None => path.to_string(),
    }
}

/// The rooms each room imports (`crate::NAME` outside its tests and comments; `gpen_video::NAME`
/// from main.rs and benches/), over every file under src/ and benches/.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let sources: Vec<String> = files_under(&root().join("src"))
        .into_iter()
        .chain(files_under(&root().join("benches")))
        .filter(|p| p.ends_with(".rs"))
        .collect();
    let modules: BTreeMap<String, String> = sources
        .iter()
        .filter(|p| p.starts_with("src/"))
        .map(|p| {
            let room = room_of(p);
            let name = room
                .trim_start_matches("src/")
                .trim_end_matches('/')
                .trim_end_matches(".rs");
            (name.to_string(), room)
        })
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &sources {
        let room = if path.starts_with("benches/") {
            "benches/".to_string()
        } else {
            room_of(path)
        };
        let text = std::fs::read_to_string(root().join(path)).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
        let targets = graph.entry(room.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for prefix in ["crate::", "gpen_video::"] {
                for (at, _) in line.match_indices(prefix) {
                    let name: String = line[at + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    // `gpen_video::api` names the facade; deeper names are the facade's too.
                    if let Some(target) = modules.get(&name).filter(|t| **t != room) {
                        targets.insert(target.clone());
                    }
                }
            }
        }
    }
    graph
}

#[test]
fn the_import_graph_has_no_circle_and_at_most_ten_floors() {
    let graph = import_graph();
    // A room's floor: one above the highest room it imports; the chain that sets it.
    fn floor(
        room: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        known: &mut BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
    ) -> Vec<String> {
        if let Some(chain) = known.get(room) {
            return chain.clone();
        }
        assert!(
            !path.iter().any(|r| r == room),
            "the import graph has a circle: {} -> {room}: move what both need to a floor below them",
            path.join(" -> ")
        );
        path.push(room.to_string());
        let mut best: Vec<String> = Vec::new();
        for next in graph.get(room).into_iter().flatten() {
            let chain = floor(next, graph, known, path);
            if chain.len() > best.len() {
                best = chain;
            }
        }
        path.pop();
        best.insert(0, room.to_string());
        known.insert(room.to_string(), best.clone());
        best
    }
    let mut known = BTreeMap::new();
    let tallest = graph
        .keys()
        .map(|room| floor(room, &graph, &mut known, &mut Vec::new()))
        .max_by_key(Vec::len)
        .unwrap();
    assert!(
        graph.get("src/main.rs").is_some_and(|t| t.contains("src/api.rs")),
        "main.rs reads the library through its facade, src/api.rs: {graph:?}"
    );
    assert!(
        tallest.len() <= FLOORS,
        "the import graph stands on {} floors, over {FLOORS}: {} (each imports the next): \
         move the names the upper rooms take from a lower room's neighbour down to where they are read",
        tallest.len(),
        tallest.join(" -> ")
    );
}

#[test]
fn the_readme_stays_short() {
    let lines = std::fs::read_to_string(root().join("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines, over 300: move the detail into docs/ (guide, models, service, \
         deployment, performance) and link to it"
    );
}

/// A heading's anchor as the usual Markdown renderers make it: lower case, punctuation dropped,
/// spaces turned into hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (a repeated heading gets `-1`, `-2`, ... as the
/// renderers number it), code blocks skipped.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = anchor(line.trim_start_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of a Markdown file's inline links `[text](target)`, code blocks and code spans
/// skipped.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans are the odd-numbered pieces between backticks.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_documents_leads_somewhere() {
    let mut documents: Vec<PathBuf> = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    documents.extend(
        files_under(&root().join("docs"))
            .into_iter()
            .filter(|p| p.ends_with(".md"))
            .map(|p| root().join(p)),
    );
    let mut broken = Vec::new();
    for doc in &documents {
        let text = std::fs::read_to_string(doc).unwrap();
        let name = doc.strip_prefix(root()).unwrap().display().to_string();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if let Some(fragment) = fragment {
                if path.extension().is_some_and(|e| e == "md") {
                    let there = std::fs::read_to_string(&path).unwrap();
                    if !anchors(&there).contains(fragment) {
                        broken.push(format!("{name}: {target} (no such heading)"));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that lead nowhere (a moved section: point the link at the file and heading it now \
         lives under):\n{}",
        broken.join("\n")
    );
}
