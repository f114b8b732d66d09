//! `docs/limits.md` lists every limit of `limits::TABLE` (the table `meshplan._core.limits()`
//! returns), so the documentation cannot go stale: this test fails when they differ, and
//! `MESHPLAN_UPDATE_LIMITS_DOC=1 cargo test -p meshplan-core --test limits_doc` rewrites the
//! table between the markers (the prose around it is hand-written).

use std::path::PathBuf;

use meshplan_core::limits::TABLE;

const BEGIN: &str = "<!-- limits table: generated from meshplan_core::limits::TABLE -->";
const END: &str = "<!-- end of limits table -->";

/// `n` with thousands separators, or `2^64 − 1` for `u64::MAX`.
fn number(n: u64) -> String {
    if n == u64::MAX {
        return "2^64 − 1".into();
    }
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn table() -> String {
    let mut out = format!("{BEGIN}\n\n| field | min | max |\n|---|---:|---:|\n");
    for (field, limit) in TABLE {
        out += &format!(
            "| `{field}` | {} | {} |\n",
            number(limit.lo),
            number(limit.hi)
        );
    }
    out + "\n" + END
}

#[test]
fn docs_limits_md_lists_every_limit() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/limits.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (start, end) = match (text.find(BEGIN), text.find(END)) {
        (Some(s), Some(e)) if s < e => (s, e + END.len()),
        _ => panic!("{}: no table markers", path.display()),
    };
    let want = table();
    if std::env::var_os("MESHPLAN_UPDATE_LIMITS_DOC").is_some() {
        std::fs::write(&path, format!("{}{want}{}", &text[..start], &text[end..])).unwrap();
        return;
    }
    assert_eq!(
        &text[start..end],
        want,
        "docs/limits.md is stale: run MESHPLAN_UPDATE_LIMITS_DOC=1 cargo test -p meshplan-core --test limits_doc"
    );
}
