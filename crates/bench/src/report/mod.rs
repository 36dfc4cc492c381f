//! Writes a finished run: `report.html`, `results.json`, `results.csv`, `env.json`, `plots/*.svg`
//! (the raw `fio/*.json` and job files were written while running), and prints terminal tables.

pub mod csv;
pub mod format;
pub mod html;
pub mod plot;
pub mod table;

use crate::error::BenchError;
use crate::model::RunReport;
use std::collections::BTreeMap;
use std::path::Path;

/// Renders every plot of the run; id -> SVG text (a plot that fails to render is reported in the HTML).
pub fn render_plots(r: &RunReport) -> BTreeMap<String, Result<String, String>> {
    r.sections
        .iter()
        .flat_map(|s| s.plots.iter())
        .map(|p| (p.id.clone(), plot::render_svg(p)))
        .collect()
}

/// Writes all report files into `dir`.
pub fn write_all(r: &RunReport, dir: &Path) -> Result<(), BenchError> {
    let w = |name: &str, text: &str| -> Result<(), BenchError> {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| BenchError::io("writing the report", &p, e))
    };
    let json = serde_json::to_string_pretty(r).map_err(|e| BenchError::Report(e.to_string()))?;
    w("results.json", &json)?;
    let env =
        serde_json::to_string_pretty(&r.env).map_err(|e| BenchError::Report(e.to_string()))?;
    w("env.json", &env)?;
    w("results.csv", &csv::render(r))?;
    let plots = render_plots(r);
    let pdir = dir.join("plots");
    std::fs::create_dir_all(&pdir).map_err(|e| BenchError::io("creating plots/", &pdir, e))?;
    for (id, svg) in &plots {
        if let Ok(svg) = svg {
            w(&format!("plots/{id}.svg"), svg)?;
        }
    }
    w("report.html", &html::render(r, &plots))?;
    Ok(())
}
