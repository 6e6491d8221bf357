//! `include/kvgate.h` is generated from `src/ffi/` by cbindgen (pinned in
//! Cargo.toml) and committed. This test regenerates it and fails when the
//! committed header differs; `KVGATE_BLESS=1` (scripts/gen-header.sh)
//! writes the regenerated header instead.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let root = root();
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

/// The first differing line, with a little context, for the failure message.
fn first_difference(committed: &str, generated: &str) -> String {
    let (a, b): (Vec<_>, Vec<_>) = (committed.lines().collect(), generated.lines().collect());
    let at = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let show = |lines: &[&str]| {
        lines[at.saturating_sub(2)..(at + 3).min(lines.len())]
            .iter()
            .map(|l| format!("    | {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "first difference at line {}:\n  committed:\n{}\n  generated:\n{}",
        at + 1,
        show(&a),
        show(&b)
    )
}

#[test]
fn committed_header_matches_the_code() {
    let path = root().join("include/kvgate.h");
    let generated = generate();
    if std::env::var_os("KVGATE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/kvgate.h");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kvgate.h is out of date with src/ffi/.\n{}\n\
         Regenerate it with ./scripts/gen-header.sh and commit it.",
        first_difference(&committed, &generated)
    );
}

/// The header's version macros are Cargo.toml's version (rustls-ffi's header
/// once defined its version number with MINOR twice; this guards ours).
#[test]
fn header_version_macros_are_the_package_version() {
    let header = std::fs::read_to_string(root().join("include/kvgate.h")).expect("header");
    for (name, value) in [
        ("KVGATE_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("KVGATE_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("KVGATE_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        let line = format!("#define {name} {value}");
        assert!(
            header.lines().any(|l| l.trim() == line),
            "include/kvgate.h lacks `{line}`"
        );
    }
}

/// Every status and reason keeps the exact name and value of the contract.
#[test]
fn header_spells_the_contract_names() {
    let header = std::fs::read_to_string(root().join("include/kvgate.h")).expect("header");
    let expected = [
        ("KVGATE_OK", 0),
        ("KVGATE_PREEMPTED", 1),
        ("KVGATE_TIMED_OUT", 2),
        ("KVGATE_CANCELLED", 3),
        ("KVGATE_CLOSED", 4),
        ("KVGATE_INVALID_ARGUMENT", 5),
        ("KVGATE_UNKNOWN_LEASE", 6),
        ("KVGATE_NOT_FOUND", 7),
        ("KVGATE_PANIC", 8),
        ("KVGATE_BUFFER_TOO_SMALL", 9),
        ("KVGATE_REASON_OPEN", 0),
        ("KVGATE_REASON_RESERVED_SESSION", 1),
        ("KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE", 2),
        ("KVGATE_REASON_RESIDENT_PREFIX", 3),
    ];
    for (name, value) in expected {
        let line = format!("{name} = {value},");
        assert!(
            header.lines().any(|l| l.trim() == line),
            "include/kvgate.h lacks `{line}`"
        );
    }
    assert!(Path::new(&root().join("cbindgen.toml")).exists());
}

/// Issue 10, bug 2: the header promised that `kvgate_free` was safe against
/// acquires "already in progress", but one made on another thread that has
/// not yet entered the gate reads freed memory. The fix is the contract:
/// the header says exactly what may overlap `kvgate_free` and names the
/// robust shutdown, and promises nothing about a call just made.
#[test]
fn header_kvgate_free_promises_only_what_the_code_keeps() {
    let header = std::fs::read_to_string(root().join("include/kvgate.h")).unwrap();
    let at = header
        .find("void kvgate_free(")
        .expect("kvgate_free is declared");
    let doc_start = header[..at]
        .rfind("/**")
        .expect("kvgate_free is documented");
    let doc = &header[doc_start..at];
    assert!(
        !doc.contains("already in progress"),
        "kvgate_free must not promise safety for calls merely in progress:\n{doc}"
    );
    for needed in [
        "has *entered* the gate",
        "may not have entered the gate yet",
        "`kvgate_close`",
        "join them",
    ] {
        assert!(
            doc.contains(needed),
            "kvgate_free's doc lacks {needed:?}:\n{doc}"
        );
    }
}
