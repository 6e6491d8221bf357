//! Every Prometheus metric the docs name is one the code emits.
//!
//! What is emitted: the families of the library's text exposition
//! (`GateStats::to_prometheus`, behind `Gate::metrics_text` and
//! `kvgate_metrics_text`) and those the vLLM plugin adds to `/metrics`
//! (`GaugeMetricFamily`/`CounterMetricFamily` in
//! `integrations/vllm/kvgate_vllm/`; a counter `x` is exposed as `x_total`).
//!
//! What the docs name: every `kvgate_<name>` in `README.md` and the Markdown
//! under `docs/`, less what is not a metric: the C header's functions and
//! types (`include/kvgate.h`), the plugin's engine-core utility methods and
//! attributes (`def kvgate_*`, `NAME = "kvgate_*"`), and the Python package
//! and module names.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const PLUGIN: &str = "integrations/vllm/kvgate_vllm";

/// Every `kvgate_<name>` in `text` (`<name>` of lowercase letters, digits and
/// underscores), not inside a longer identifier.
fn names(text: &str) -> BTreeSet<String> {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("kvgate_") {
        let start = from + at;
        let mut end = start + "kvgate_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        let inside =
            (start > 0 && ident(bytes[start - 1])) || (end < bytes.len() && ident(bytes[end]));
        if !inside && end > start + "kvgate_".len() {
            out.insert(text[start..end].trim_end_matches('_').to_string());
        }
        from = end;
    }
    out
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// The families the library's text exposition declares.
fn library_metrics() -> BTreeSet<String> {
    kvgate::GateStats::default()
        .to_prometheus()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect()
}

/// The plugin's Python sources.
fn plugin_sources() -> Vec<(PathBuf, String)> {
    let mut paths = Vec::new();
    files(&Path::new(ROOT).join(PLUGIN), "py", &mut paths);
    paths.sort();
    assert!(!paths.is_empty(), "no Python files under {PLUGIN}");
    paths.into_iter().map(|p| (p.clone(), read(&p))).collect()
}

/// The families the plugin adds: the first string after each
/// `GaugeMetricFamily` or `CounterMetricFamily` (a call or a tuple entry).
fn plugin_metrics(sources: &[(PathBuf, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, text) in sources {
        for (kind, suffix) in [("GaugeMetricFamily", ""), ("CounterMetricFamily", "_total")] {
            for (at, _) in text.match_indices(kind) {
                let rest = text[at + kind.len()..].trim_start();
                let Some(rest) = rest.strip_prefix(['(', ',']) else {
                    continue; // an import or a type name, not a family made
                };
                let Some(rest) = rest.trim_start().strip_prefix('"') else {
                    continue; // made from a variable (a tuple's entry, read above)
                };
                let name = &rest[..rest.find('"').unwrap()];
                if name.starts_with("kvgate_") {
                    out.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    out
}

/// `kvgate_*` names that are not metrics: the C header's, the plugin's
/// utility methods and attributes, and package and module names.
fn not_metrics(sources: &[(PathBuf, String)]) -> BTreeSet<String> {
    let mut out = names(&read(&Path::new(ROOT).join("include/kvgate.h")));
    for (path, text) in sources {
        for line in text.lines() {
            let line = line.trim_start();
            if let Some(def) = line
                .strip_prefix("def ")
                .or_else(|| line.strip_prefix("async def "))
            {
                out.extend(names(def.split('(').next().unwrap()));
            }
            if let Some((lhs, rhs)) = line.split_once(" = \"") {
                if lhs.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    out.extend(names(rhs.split('"').next().unwrap()));
                }
            }
        }
        out.extend(names(path.file_stem().unwrap().to_str().unwrap()));
    }
    out.insert("kvgate_vllm".to_string());
    out
}

#[test]
fn every_metric_the_docs_name_is_emitted() {
    let sources = plugin_sources();
    let library = library_metrics();
    let plugin = plugin_metrics(&sources);
    assert!(library.contains("kvgate_admissions_total"), "{library:?}");
    assert!(
        plugin.contains("kvgate_working_set_free_tokens"),
        "{plugin:?}"
    );
    assert!(plugin.contains("kvgate_refused_total"), "{plugin:?}");
    let emitted: BTreeSet<String> = library.union(&plugin).cloned().collect();
    let skip = not_metrics(&sources);

    let mut docs = vec![Path::new(ROOT).join("README.md")];
    files(&Path::new(ROOT).join("docs"), "md", &mut docs);
    docs.sort();
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        for (n, line) in read(doc).lines().enumerate() {
            for name in names(line) {
                if skip.contains(&name) {
                    continue;
                }
                checked += 1;
                if !emitted.contains(&name) {
                    let at = doc.strip_prefix(ROOT).unwrap_or(doc).display();
                    missing.push(format!("{at}:{}: {name}", n + 1));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} metric names found in the docs"
    );
    assert!(
        missing.is_empty(),
        "the docs name metrics the code does not emit:\n  {}\nemitted: {emitted:?}",
        missing.join("\n  ")
    );
}

#[test]
fn the_name_scan_sees_what_a_doc_line_holds() {
    let found =
        names("`kvgate_admissions_total{reason=...}`, kvgate_x_, my_kvgate_y, `kvgate_stats.z`");
    let found: Vec<&str> = found.iter().map(String::as_str).collect();
    assert_eq!(
        found,
        ["kvgate_admissions_total", "kvgate_stats", "kvgate_x"]
    );
}
