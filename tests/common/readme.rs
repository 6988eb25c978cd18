//! What the README tells operators to run, read from the README itself, so
//! that the tests and the benchmark harness exercise exactly that text.
//! (The harness includes this file by path.)

/// The statements of README's *Searching published messages by key
/// (PostgreSQL)*: its `sql` block, one string per statement.
pub fn published_key_index() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = &readme[readme
        .find("**Searching published messages by key (PostgreSQL).**")
        .expect("README has the section")..];
    let block = &section[section.find("```sql\n").unwrap() + 7..];
    block[..block.find("```").unwrap()]
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}
