//! What the book tells operators to run, read from the book itself, so
//! that the tests and the benchmark harness exercise exactly that text.
//! (The harness includes this file by path.)

/// The statements of the book's *Searching published messages by key
/// (PostgreSQL)* (`docs/operations.md`): its `sql` block, one string per
/// statement.
pub fn published_key_index() -> Vec<String> {
    let page = include_str!("../../docs/operations.md");
    let section = &page[page
        .find("## Searching published messages by key (PostgreSQL)")
        .expect("docs/operations.md has the section")..];
    let block = &section[section.find("```sql\n").unwrap() + 7..];
    block[..block.find("```").unwrap()]
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}
