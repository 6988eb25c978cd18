//! The documentation and the code agree: every configuration key is in the
//! book's reference and the reference names no key the code lacks; every
//! relative link and anchor in README.md, BENCHMARKS.md, CHANGELOG.md and
//! `docs/` resolves; every error line in the troubleshooting page is one the
//! code can print; the code map in the contributing page names only what
//! exists; the history of the work stays in git. No service needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use outboxd::config::env;
use outboxd::config::sources::SourceConfig;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every leaf of a TOML table with its dotted key.
fn leaves(table: &toml::Table, prefix: &str, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => leaves(t, &key, out),
            v => out.push((key, v.clone())),
        }
    }
}

/// Every key the code has, as the environment reader knows them.
fn code_keys() -> BTreeSet<String> {
    env::keys().into_iter().filter(|k| k != "source").collect()
}

/// Every key a `[[source]]` entry has, sections as one key each.
fn source_keys() -> BTreeSet<String> {
    let section: toml::Table = toml::from_str("k = 1").unwrap();
    let source = SourceConfig {
        name: "n".into(),
        url: "u".into(),
        listen_url: "l".into(),
        pooler: Some(outboxd::config::Pooler::Transaction),
        partition_count: Some(16),
        database: section.clone(),
        amqp: section.clone(),
        outbox: section.clone(),
        worker: section.clone(),
        tables: section,
    };
    let table = toml::Table::try_from(&source).expect("a source serialises");
    table.keys().map(|k| format!("source.{k}")).collect()
}

/// The keys set (not commented out) in `config/outboxd.toml`, with their values.
fn file_values() -> Vec<(String, toml::Value)> {
    let table: toml::Table = toml::from_str(&read(&root().join("config/outboxd.toml")))
        .expect("config/outboxd.toml parses");
    let mut values = Vec::new();
    leaves(&table, "", &mut values);
    values
}

/// The keys of the configuration reference: the first cell of every table row
/// under `## Reference` in docs/configuration.md, each backticked name in it
/// (`[source.amqp]` read as `source.amqp`).
fn reference_keys() -> BTreeSet<String> {
    let page = read(&root().join("docs/configuration.md"));
    let reference = &page[page
        .find("\n## Reference\n")
        .expect("docs/configuration.md has a Reference section")..];
    let end = reference[1..]
        .find("\n## ")
        .map_or(reference.len(), |i| i + 1);
    let mut keys = BTreeSet::new();
    for line in reference[..end].lines() {
        let Some(row) = line.strip_prefix("| ") else {
            continue;
        };
        let first = row.split(" | ").next().unwrap_or("");
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 && part != "key" {
                keys.insert(part.trim_matches(['[', ']']).to_string());
            }
        }
    }
    keys
}

#[test]
fn every_configuration_key_is_in_the_reference_and_no_other() {
    let reference = reference_keys();
    let code: BTreeSet<String> = code_keys().union(&source_keys()).cloned().collect();
    let missing: Vec<_> = code.difference(&reference).collect();
    let unknown: Vec<_> = reference.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "keys of the code missing from docs/configuration.md's reference: {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/configuration.md's reference names keys the code does not have: {unknown:?}"
    );
    let file: BTreeSet<String> = file_values().into_iter().map(|(k, _)| k).collect();
    let code = code_keys();
    assert!(
        file == code,
        "config/outboxd.toml and the code differ: only in the file {:?}, only in the code {:?}",
        file.difference(&code).collect::<Vec<_>>(),
        code.difference(&file).collect::<Vec<_>>()
    );
}

#[test]
fn the_reference_gives_every_key_its_default_and_variable() {
    let page = read(&root().join("docs/configuration.md"));
    for (key, value) in file_values() {
        let variable = env::variable_for(&key);
        let row = page
            .lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("no reference row for {key}"));
        assert!(
            row.contains(&format!("`{value}`")),
            "the reference's row for {key} does not give its default {value}: {row}"
        );
        assert!(
            row.contains(&format!("`{variable}`")),
            "the reference's row for {key} does not name {variable}: {row}"
        );
    }
}

/// The Markdown files whose links must resolve.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("BENCHMARKS.md"),
        root().join("CHANGELOG.md"),
    ];
    let mut book: Vec<_> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    book.sort();
    files.extend(book);
    files
}

/// A file's text without its fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchors for a Markdown file's headings: lower case, letters,
/// digits, spaces, `-` and `_` kept, spaces as `-`; repeats numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// The targets of `[text](target)` links in a text.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            targets.push(rest[..end].trim().to_string());
        }
    }
    targets
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text = read(&file);
        for target in link_targets(&prose(&text)) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !resolved.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && !anchors(&read(&resolved)).contains(anchor)
            {
                broken.push(format!("{}: {target} (no such heading)", file.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every `.rs` file under `src/`, with Rust's `\` line continuations joined,
/// so that a message split over lines reads as printed.
fn source_text() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&read(&path));
            }
        }
    }
    let mut raw = String::new();
    walk(&root().join("src"), &mut raw);
    let mut joined = String::with_capacity(raw.len());
    let mut lines = raw.split('\n').peekable();
    while let Some(line) = lines.next() {
        if let Some(start) = line.strip_suffix('\\') {
            joined.push_str(start);
            if let Some(next) = lines.peek_mut() {
                *next = next.trim_start();
            }
        } else {
            joined.push_str(line);
            joined.push('\n');
        }
    }
    joined
}

#[test]
fn every_error_line_in_troubleshooting_is_one_the_code_prints() {
    let page = read(&root().join("docs/troubleshooting.md"));
    let source = source_text();
    let mut entries = 0;
    let mut unknown = Vec::new();
    for line in page.lines() {
        let Some(heading) = line.strip_prefix("### ") else {
            continue;
        };
        let ticks = heading.len() - heading.trim_start_matches('`').len();
        assert!(
            ticks > 0,
            "a troubleshooting heading is not an error line in backticks: {heading}"
        );
        let message = heading[ticks..heading.len() - ticks].trim_matches(' ');
        entries += 1;
        for fragment in message.split('…') {
            if fragment.trim().len() >= 12 && !source.contains(fragment) {
                unknown.push(format!("{fragment:?} (of {message:?})"));
            }
        }
    }
    assert!(entries >= 20, "only {entries} entries found");
    assert!(
        unknown.is_empty(),
        "troubleshooting lists text the code does not print:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_repository_speaks_about_the_product_only() {
    let pattern = |text: &str| -> Option<String> {
        let lower = text.to_lowercase();
        for word in ["session ", "issue ", "issue #"] {
            let mut at = 0;
            while let Some(i) = lower[at..].find(word) {
                let start = at + i;
                let after = &lower[start + word.len()..];
                let before_ok = start == 0 || !lower.as_bytes()[start - 1].is_ascii_alphanumeric();
                if before_ok && after.starts_with(|c: char| c.is_ascii_digit()) {
                    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                    return Some(format!("{word}{digits}"));
                }
                at = start + word.len();
            }
        }
        None
    };
    let mut found = Vec::new();
    let mut files = documents();
    for dir in [
        "src",
        "tests",
        "benches",
        "scripts",
        "config",
        "deploy",
        "packaging",
    ] {
        let mut stack = vec![root().join(dir)];
        while let Some(path) = stack.pop() {
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "node_modules") {
                    continue;
                }
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else {
                files.push(path);
            }
        }
    }
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        if let Some(hit) = pattern(&text) {
            found.push(format!("{}: {hit}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "the repository's text names development history (say what the product does now):\n{}",
        found.join("\n")
    );
}

#[test]
fn every_metric_is_in_the_observability_page() {
    let page = read(&root().join("docs/observability.md"));
    let mut names = BTreeSet::new();
    let files = [
        "src/dashboard/metrics.rs",
        "src/worker/probes.rs",
        "src/relay/stats.rs",
    ];
    for file in files {
        let text = read(&root().join(file));
        for piece in text.split("\"outboxd_").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            names.insert(format!("outboxd_{name}"));
        }
    }
    assert!(names.len() >= 20, "only {} series found", names.len());
    let missing: Vec<_> = names
        .iter()
        .filter(|n| !page.contains(&format!("| `{n}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "series missing from docs/observability.md's table: {missing:?}"
    );
    // The same counters' OTLP names, in the page's OTLP section.
    let stats = read(&root().join("src/relay/stats.rs"));
    let otlp: Vec<&str> = stats
        .split("otlp: \"")
        .skip(1)
        .filter_map(|piece| piece.split('"').next())
        .collect();
    assert!(otlp.len() >= 9, "only {} OTLP names found", otlp.len());
    let missing: Vec<_> = otlp
        .iter()
        .filter(|n| !page.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "OTLP metrics missing from docs/observability.md: {missing:?}"
    );
}

/// The code map in docs/contributing.md (`## The code`): every path in its
/// first column exists, and so does every `.rs` file its lines name under a
/// directory entry (`gate.rs` under `src/amqp/`).
#[test]
fn every_path_in_the_code_map_exists() {
    let page = read(&root().join("docs/contributing.md"));
    let section = &page[page
        .find("\n## The code\n")
        .expect("docs/contributing.md has a code map")..];
    let block = section
        .split("```")
        .nth(1)
        .expect("the code map is a code block");
    let mut missing = Vec::new();
    let mut entry = PathBuf::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let indented = line.starts_with(' ');
        if !indented {
            let path = line.split_whitespace().next().expect("a path");
            entry = PathBuf::from(path);
            if !root().join(&entry).exists() {
                missing.push(path.to_string());
            }
        }
        // The `.rs` files an entry's lines name are under it, when it is a
        // directory.
        if !entry.to_string_lossy().ends_with('/') {
            continue;
        }
        let words = line
            .split(|c: char| c.is_whitespace() || ",:;()".contains(c))
            .skip(usize::from(!indented));
        for name in words.filter(|w| w.ends_with(".rs")) {
            if !root().join(&entry).join(name).exists() {
                missing.push(format!("{}{name}", entry.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the code map names what is not there: {missing:?}"
    );
}
