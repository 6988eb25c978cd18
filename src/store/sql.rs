//! SQL text as the store holds it: statement templates rendered once with
//! the configured table names ([`Sql`]), and the one literal ever spliced
//! into a statement (a bucket label).

use std::sync::Arc;

use super::settings::Tables;

/// Renders a statement template: `{outbox}`, `{partitions}` and
/// `{workers}` become the configured table names (validated identifiers,
/// see `config::validate`).
pub(crate) fn render(tables: &Tables, template: &str) -> String {
    template
        .replace("{outbox}", &tables.outbox)
        .replace("{partitions}", &tables.partitions)
        .replace("{workers}", &tables.workers)
}

/// A rendered SQL statement, cheap to clone into a query (opaque outside
/// the store).
#[derive(Debug, Clone)]
pub struct Sql(Arc<str>);

impl Sql {
    /// Renders a statement template (see [`render`]).
    pub(crate) fn render(tables: &Tables, template: &str) -> Self {
        Sql(render(tables, template).into())
    }

    /// A statement already rendered (a backend's own [`render`]).
    pub(crate) fn from_rendered(sql: String) -> Self {
        Sql(sql.into())
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn q(&self) -> sqlx::SqlStr {
        use sqlx::SqlSafeStr;
        // Only validated identifiers are spliced in (see config::validate).
        sqlx::AssertSqlSafe(self.0.clone()).into_sql_str()
    }
}

/// A bucket label as an SQL literal. Labels are `p` and digits (checked by
/// the partitioner and the schema), so quoting is all it needs; anything
/// else is refused rather than spliced.
pub(crate) fn label_literal(label: &str) -> Option<String> {
    let ok = label.len() <= 8
        && label.starts_with('p')
        && label[1..].bytes().all(|b| b.is_ascii_digit());
    ok.then(|| format!("'{label}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bucket_labels_become_literals() {
        assert_eq!(label_literal("p07").as_deref(), Some("'p07'"));
        assert_eq!(label_literal("p07'; DROP TABLE x; --"), None);
        assert_eq!(label_literal("x07"), None);
    }
}
