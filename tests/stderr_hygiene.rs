//! No compile error a user can see names a private item: every expected
//! `.stderr` of the trybuild suites (and any other `.stderr` in the repo) is
//! searched for identifiers that start with `__` (the macros' hidden locals,
//! the `__private` module) and for the names of private helpers.

use std::fs;
use std::path::{Path, PathBuf};

/// Helpers generated code once named that must never reach a user.
const PRIVATE_HELPERS: [&str; 4] = [
    "AsStore",
    "AbsorbsStoreError",
    "HandlerResult",
    "urn_literal",
];

fn stderr_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("the directory is readable") {
        let path = entry.expect("the entry is readable").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("");
        if path.is_dir() {
            // Build output and VCS data hold no expected compiler output.
            if !matches!(name, "target" | ".git") {
                stderr_files(&path, found);
            }
        } else if name.ends_with(".stderr") {
            found.push(path);
        }
    }
}

/// Every identifier in `text` that starts with `__` (a word boundary, then
/// two underscores, then at least one identifier character).
fn dunder_identifiers(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let is_ident = |byte: u8| byte.is_ascii_alphanumeric() || byte == b'_';
    let mut found = Vec::new();
    let mut start = 0;
    while let Some(offset) = text[start..].find("__") {
        let at = start + offset;
        let mut end = at;
        while end < bytes.len() && is_ident(bytes[end]) {
            end += 1;
        }
        let starts_a_word = at == 0 || !is_ident(bytes[at - 1]);
        if starts_a_word && bytes[at + 2..end].iter().any(|&b| b != b'_') {
            found.push(&text[at..end]);
        }
        start = end.max(at + 2);
    }
    found
}

#[test]
fn no_stderr_names_a_private_item() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    stderr_files(root, &mut files);
    assert!(
        files.len() >= 20,
        "expected the trybuild suites' .stderr files, found {}",
        files.len()
    );

    let mut leaks = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("the .stderr is UTF-8");
        let shown = file.strip_prefix(root).unwrap_or(file).display();
        for identifier in dunder_identifiers(&text) {
            leaks.push(format!("{shown}: `{identifier}`"));
        }
        for helper in PRIVATE_HELPERS {
            if text.contains(helper) {
                leaks.push(format!("{shown}: `{helper}`"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "private items in compiler output:\n{}",
        leaks.join("\n")
    );
}

#[test]
fn the_scan_finds_what_it_looks_for() {
    assert_eq!(
        dunder_identifiers("inside `Urn::__from_literal` and babel_idem::__private::Guard"),
        ["__from_literal", "__private"]
    );
    assert_eq!(
        dunder_identifiers("a__b, ___, __ and snake_case"),
        Vec::<&str>::new()
    );
}
