//! `--fit-steps FILE`: step-time coefficients from an engine's measured
//! steps, by ordinary least squares on the model of
//! [`crate::engine::step_time`]:
//! `duration = β0 + β1 · prefill + β2 · decode [+ β3 · context] [+ β4 · attention pairs]`.
//!
//! Two inputs are read:
//! - **a CSV** with a header, as the real-engine benchmark writes with
//!   `--steps-csv` (`integrations/vllm/bench/real_engine.py`): `dur_ms`,
//!   `prefill_tokens` and `decode_tokens` are required; a `context_tokens`
//!   column fits β3 and an `attn_pairs` column fits β4;
//! - **a JSON** object with a `rows` array, as the GPU step measurement
//!   writes it (`sim/profiles/data/`): each row has `ms` and either the
//!   regressors (`prefill`, `decode`, `context`, `attn_pairs`) or the
//!   step's shape (`N` new tokens over `C` cached ones, `B` decode
//!   sequences over `Cd` resident tokens each), from which they are
//!   computed as the simulator charges them.
//!
//! A coefficient the rows cannot determine (no row with decode sequences, a
//! column that is a multiple of another) is an error naming it, not a
//! number. Fit on a quiet machine: on a shared one other jobs' load is the
//! largest term.

use std::fmt::Write as _;

use crate::engine::step_time::{StepCost, StepLoad};

/// The model's terms, in coefficient order after β0.
const TERMS: [(&str, &str); 4] = [
    ("beta1_us", "prefill tokens"),
    ("beta2_us", "decode sequences"),
    ("beta3_us", "context tokens"),
    ("beta4_us", "attention pairs"),
];

/// A fit of the step-time model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// The coefficients; a term the input had no column for is 0.
    pub cost: StepCost,
    /// Whether β3 was fitted (the input had a context column).
    pub fitted_context: bool,
    /// Whether β4 was fitted (the input had an attention column).
    pub fitted_attention: bool,
    /// Steps fitted.
    pub steps: usize,
    /// Root-mean-square residual, ms.
    pub rms_ms: f64,
    /// Largest residual relative to its step's duration.
    pub max_rel_err: f64,
    /// Fraction of the variance explained.
    pub r2: f64,
}

/// One measured step: its duration and what it scheduled; `None` where the
/// input has no column for a term.
#[derive(Debug, Clone, Copy)]
struct Row {
    ms: f64,
    prefill: f64,
    decode: f64,
    context: Option<f64>,
    attn_pairs: Option<f64>,
}

/// Reads a step file (JSON if it starts with `{`, CSV otherwise) and fits it.
pub fn fit_file(text: &str) -> Result<Fit, String> {
    let rows = if text.trim_start().starts_with('{') {
        read_json(text)?
    } else {
        read_csv(text)?
    };
    fit_rows(&rows)
}

fn fit_rows(rows: &[Row]) -> Result<Fit, String> {
    let first = rows.first().ok_or("no steps in the file")?;
    let (with_context, with_attention) = (first.context.is_some(), first.attn_pairs.is_some());
    let used: Vec<usize> = [true, true, with_context, with_attention]
        .iter()
        .enumerate()
        .filter_map(|(i, &on)| on.then_some(i))
        .collect();
    // The design matrix: a leading 1 for β0, then the terms fitted.
    let design: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            let all = [
                r.prefill,
                r.decode,
                r.context.unwrap_or(0.0),
                r.attn_pairs.unwrap_or(0.0),
            ];
            std::iter::once(1.0)
                .chain(used.iter().map(|&i| all[i]))
                .collect()
        })
        .collect();
    let k = used.len() + 1;
    if rows.len() < k + 1 {
        return Err(format!(
            "{} steps are too few to fit {k} coefficients",
            rows.len()
        ));
    }
    let term = |col: usize| -> (&str, &str) {
        if col == 0 {
            ("beta0_ms", "the fixed cost")
        } else {
            TERMS[used[col - 1]]
        }
    };
    for col in 1..k {
        if design.iter().all(|x| x[col] == 0.0) {
            let (name, what) = term(col);
            return Err(format!(
                "no step has any {what}: `{name}` cannot be determined from this file"
            ));
        }
    }
    // Columns are scaled to a unit maximum before solving: attention pairs
    // run to 1e9 where the constant is 1, and unscaled normal equations
    // would lose the small terms to rounding.
    let scale: Vec<f64> = (0..k)
        .map(|c| design.iter().map(|x| x[c].abs()).fold(0.0, f64::max))
        .collect();
    let mut a = vec![vec![0.0; k + 1]; k];
    for (r, x) in rows.iter().zip(&design) {
        let v: Vec<f64> = x.iter().zip(&scale).map(|(v, s)| v / s).collect();
        for i in 0..k {
            for j in 0..k {
                a[i][j] += v[i] * v[j];
            }
            a[i][k] += v[i] * r.ms;
        }
    }
    let diag: Vec<f64> = (0..k).map(|i| a[i][i]).collect();
    // Gauss-Jordan elimination with partial pivoting; a pivot that has
    // lost nearly all its weight means that column is a combination of
    // the others.
    for i in 0..k {
        let p = (i..k)
            .max_by(|&x, &y| a[x][i].abs().total_cmp(&a[y][i].abs()))
            .expect("rows");
        a.swap(i, p);
        if a[i][i].abs() < 1e-9 * diag[i].max(f64::MIN_POSITIVE) {
            let (name, what) = term(i);
            return Err(format!(
                "the steps do not vary enough to tell {what} from the other terms: `{name}` cannot be determined from this file"
            ));
        }
        let pivot = a[i].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != i {
                let f = row[i] / pivot[i];
                for (cell, p) in row.iter_mut().zip(&pivot).skip(i) {
                    *cell -= f * p;
                }
            }
        }
    }
    let beta: Vec<f64> = (0..k).map(|i| a[i][k] / a[i][i] / scale[i]).collect();
    let predict = |x: &[f64]| x.iter().zip(&beta).map(|(v, b)| v * b).sum::<f64>();
    let mean = rows.iter().map(|r| r.ms).sum::<f64>() / rows.len() as f64;
    let (mut ss_res, mut ss_tot, mut max_rel) = (0.0, 0.0, 0.0f64);
    for (r, x) in rows.iter().zip(&design) {
        let e = r.ms - predict(x);
        ss_res += e * e;
        ss_tot += (r.ms - mean).powi(2);
        if r.ms > 0.0 {
            max_rel = max_rel.max(e.abs() / r.ms);
        }
    }
    let mut coef = [0.0; 4];
    for (j, &i) in used.iter().enumerate() {
        coef[i] = beta[j + 1] * 1e3; // ms per unit -> µs per unit
    }
    Ok(Fit {
        cost: StepCost {
            beta0_ms: beta[0],
            beta1_us: coef[0],
            beta2_us: coef[1],
            beta3_us: coef[2],
            beta4_us: coef[3],
        },
        fitted_context: with_context,
        fitted_attention: with_attention,
        steps: rows.len(),
        rms_ms: (ss_res / rows.len() as f64).sqrt(),
        max_rel_err: max_rel,
        r2: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            0.0
        },
    })
}

fn read_csv(text: &str) -> Result<Vec<Row>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = split_csv(lines.next().ok_or("empty file")?);
    let col = |name: &str| header.iter().position(|h| h == name);
    let need = |name: &str| {
        col(name).ok_or(format!(
            "no `{name}` column in the header (a steps CSV needs dur_ms, prefill_tokens and decode_tokens; context_tokens and attn_pairs are optional)"
        ))
    };
    let (dur, prefill, decode) = (
        need("dur_ms")?,
        need("prefill_tokens")?,
        need("decode_tokens")?,
    );
    let (context, attn) = (col("context_tokens"), col("attn_pairs"));
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let cells = split_csv(line);
        let num = |i: usize| -> Result<f64, String> {
            cells
                .get(i)
                .and_then(|c| c.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .ok_or(format!(
                    "line {}: column `{}` is not a finite number",
                    n + 2,
                    header[i]
                ))
        };
        rows.push(Row {
            ms: num(dur)?,
            prefill: num(prefill)?,
            decode: num(decode)?,
            context: context.map(num).transpose()?,
            attn_pairs: attn.map(num).transpose()?,
        });
    }
    Ok(rows)
}

fn read_json(text: &str) -> Result<Vec<Row>, String> {
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let rows = doc
        .get("rows")
        .and_then(|r| r.as_array())
        .ok_or("no `rows` array in the JSON")?;
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let field = |name: &str| -> Option<f64> { row.get(name).and_then(|v| v.as_f64()) };
        let ms = field("ms")
            .filter(|v| v.is_finite())
            .ok_or(format!("row {i}: no finite `ms`"))?;
        let load = match (field("N"), field("C"), field("B"), field("Cd")) {
            (Some(n), Some(c), Some(b), Some(cd)) => {
                let int = |v: f64, name: &str| -> Result<u64, String> {
                    (v >= 0.0 && v.fract() == 0.0)
                        .then_some(v as u64)
                        .ok_or(format!("row {i}: `{name}` must be a whole number >= 0"))
                };
                let (n, c, b, cd) = (int(n, "N")?, int(c, "C")?, int(b, "B")?, int(cd, "Cd")?);
                let mut load = StepLoad::default();
                if n > 0 {
                    load.add(c, n, false);
                }
                for _ in 0..b {
                    load.add(cd, 1, true);
                }
                Some(load)
            }
            _ => None,
        };
        let r = match load {
            Some(l) => Row {
                ms,
                prefill: l.prefill as f64,
                decode: l.decode as f64,
                context: Some(l.context as f64),
                attn_pairs: Some(l.attn_pairs as f64),
            },
            None => Row {
                ms,
                prefill: field("prefill").ok_or(format!(
                    "row {i}: neither the shape (N, C, B, Cd) nor `prefill`"
                ))?,
                decode: field("decode").ok_or(format!("row {i}: no `decode`"))?,
                context: field("context"),
                attn_pairs: field("attn_pairs"),
            },
        };
        out.push(r);
    }
    if out
        .iter()
        .any(|r| r.context.is_some() != out[0].context.is_some())
        || out
            .iter()
            .any(|r| r.attn_pairs.is_some() != out[0].attn_pairs.is_some())
    {
        return Err("rows disagree on which of `context` and `attn_pairs` they carry".into());
    }
    Ok(out)
}

fn split_csv(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cell)),
            _ => cell.push(ch),
        }
    }
    out.push(cell);
    out.into_iter().map(|c| c.trim().to_string()).collect()
}

/// The fit as profile lines plus its quality.
pub fn report(f: &Fit) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fitted {} steps: rms residual {:.3} ms, largest error {:.0}% of its step, R² {:.4}",
        f.steps,
        f.rms_ms,
        f.max_rel_err * 100.0,
        f.r2
    );
    let c = &f.cost;
    let _ = writeln!(out, "beta0_ms = {:.4}", c.beta0_ms);
    let _ = writeln!(out, "beta1_us = {:.4}", c.beta1_us);
    let _ = writeln!(out, "beta2_us = {:.4}", c.beta2_us);
    match f.fitted_context {
        true => _ = writeln!(out, "beta3_us = {:.6}", c.beta3_us),
        false => _ = writeln!(out, "# beta3_us not fitted: no context column"),
    }
    match f.fitted_attention {
        true => _ = writeln!(out, "beta4_us = {:.8}", c.beta4_us),
        false => _ = writeln!(out, "# beta4_us not fitted: no attention-pairs column"),
    }
    if [c.beta0_ms, c.beta1_us, c.beta2_us, c.beta3_us, c.beta4_us]
        .iter()
        .any(|&v| v < 0.0)
    {
        out.push_str("warning: a negative coefficient: the timings are too noisy (a loaded machine?) or the model does not fit this engine; a profile refuses it\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_the_coefficients_of_synthetic_csv_steps() {
        let mut csv = String::from(
            "policy,t,dur_ms,prefill_tokens,decode_tokens,context_tokens,attn_pairs\n",
        );
        for i in 0..60u64 {
            let (p, d, c) = ((i * 37) % 2048, (i * 7) % 64, (i * 911) % 20_000);
            let pairs = p * c + (i * 13) % 5000;
            let ms =
                4.0 + 0.06 * p as f64 + 0.2 * d as f64 + 0.0001 * c as f64 + 2e-6 * pairs as f64;
            csv.push_str(&format!(
                "\"kvgate:wm=0.2,grace=1\",{i},{ms},{p},{d},{c},{pairs}\n"
            ));
        }
        let f = fit_file(&csv).unwrap();
        let c = f.cost;
        assert!((c.beta0_ms - 4.0).abs() < 1e-6, "{f:?}");
        assert!((c.beta1_us - 60.0).abs() < 1e-5, "{f:?}");
        assert!((c.beta2_us - 200.0).abs() < 1e-5, "{f:?}");
        assert!((c.beta3_us - 0.1).abs() < 1e-7, "{f:?}");
        assert!((c.beta4_us - 0.002).abs() < 1e-9, "{f:?}");
        assert!(f.r2 > 0.999999 && f.fitted_attention && f.fitted_context);
        assert!(report(&f).contains("beta1_us = 60.0000"));
    }

    #[test]
    fn a_csv_without_the_optional_columns_fits_three_terms() {
        let mut csv = String::from("dur_ms,prefill_tokens,decode_tokens\n");
        for i in 0..20u32 {
            let (p, d) = ((i * 37) % 2048, (i * 7) % 64);
            csv.push_str(&format!(
                "{},{p},{d}\n",
                4.0 + 0.06 * p as f64 + 0.2 * d as f64
            ));
        }
        let f = fit_file(&csv).unwrap();
        assert!(!f.fitted_context && !f.fitted_attention);
        assert_eq!((f.cost.beta3_us, f.cost.beta4_us), (0.0, 0.0));
        assert!(report(&f).contains("beta4_us not fitted"));
    }

    /// The golden test: the committed H200 measurement re-fitted reproduces
    /// the coefficients published with it (within 1%) and the
    /// `h200-llama8b` profile (which is this fit).
    #[test]
    fn the_h200_measurement_refits_to_its_published_coefficients() {
        let text = include_str!("../profiles/data/h200-llama8b-step-costs.json");
        let f = fit_file(text).unwrap();
        let c = f.cost;
        let near = |got: f64, want: f64| (got - want).abs() <= 0.01 * want.abs();
        // As published with the data (its `fit.with_attn`).
        for (got, want) in [
            (c.beta0_ms, 3.2775),
            (c.beta1_us, 25.8863),
            (c.beta2_us, 44.0196),
            (c.beta3_us, 0.043002),
            (c.beta4_us, 0.00152343),
        ] {
            assert!(near(got, want), "{got} against {want}: {f:?}");
        }
        assert!(f.r2 > 0.9998, "{f:?}");
        let profile = crate::engine::profile::Profile::load("h200-llama8b").unwrap();
        let p = profile.cost;
        for (got, want) in [
            (c.beta0_ms, p.beta0_ms),
            (c.beta1_us, p.beta1_us),
            (c.beta2_us, p.beta2_us),
            (c.beta3_us, p.beta3_us),
            (c.beta4_us, p.beta4_us),
        ] {
            assert!(near(got, want), "profile {want} against the fit {got}");
        }
        // The four-term model cannot express a chunk over a long prefix.
        let four: String = text.replace("\"attn_pairs\"", "\"unused\"");
        let without: serde_json::Value = serde_json::from_str(&four).unwrap();
        let rows: Vec<Row> = without["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| Row {
                ms: r["ms"].as_f64().unwrap(),
                prefill: r["prefill"].as_f64().unwrap(),
                decode: r["decode"].as_f64().unwrap(),
                context: r["context"].as_f64(),
                attn_pairs: None,
            })
            .collect();
        let f4 = fit_rows(&rows).unwrap();
        assert!(f4.r2 < 0.85 && f4.max_rel_err > 0.9, "{f4:?}");
    }

    #[test]
    fn refuses_what_it_cannot_determine_by_name() {
        assert!(fit_file("dur_ms,prefill_tokens\n1,2\n")
            .unwrap_err()
            .contains("decode_tokens"));
        assert!(fit_file("dur_ms,prefill_tokens,decode_tokens\n1,2,3\n")
            .unwrap_err()
            .contains("too few"));
        let no_decode = "dur_ms,prefill_tokens,decode_tokens\n1,10,0\n2,20,0\n3,30,0\n4,45,0\n";
        let e = fit_file(no_decode).unwrap_err();
        assert!(e.contains("beta2_us") && e.contains("decode"), "{e}");
        // Context always ten times the prefill: the two cannot be told apart.
        let collinear = "dur_ms,prefill_tokens,decode_tokens,context_tokens\n\
             1,10,1,100\n2,20,3,200\n3,30,2,300\n5,45,7,450\n6,50,1,500\n";
        let e = fit_file(collinear).unwrap_err();
        assert!(e.contains("cannot be determined"), "{e}");
        assert!(fit_file("dur_ms,prefill_tokens,decode_tokens\n1,x,2\n")
            .unwrap_err()
            .contains("prefill_tokens"));
        assert!(fit_file("{\"rows\": [{\"N\": 1}]}")
            .unwrap_err()
            .contains("ms"));
        assert!(fit_file("{\"steps\": []}").unwrap_err().contains("rows"));
    }
}
