//! Terminal tables (comfy-table) for the end of a run.

use crate::model::{RunReport, Table};
use comfy_table::{
    Cell as TCell, ContentArrangement, Table as CTable, presets::UTF8_FULL_CONDENSED,
};

/// One table as text.
pub fn render(t: &Table) -> String {
    let mut ct = CTable::new();
    ct.load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(160);
    ct.set_header(t.columns.iter().map(TCell::new));
    for row in &t.rows {
        ct.add_row(row.iter().map(|c| TCell::new(&c.text)));
    }
    format!("{}\n{ct}\n{}", t.title, t.caption)
}

/// Every section's findings and tables.
pub fn render_run(r: &RunReport) -> String {
    let mut out = String::new();
    for s in &r.sections {
        out.push_str(&format!("\n== {} ==\n", s.title));
        for f in &s.findings {
            out.push_str(&format!("  * {f}\n"));
        }
        for t in &s.tables {
            out.push_str(&render(t));
            out.push('\n');
        }
    }
    out
}
