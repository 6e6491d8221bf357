//! `--fit-steps FILE`: the step-time coefficients from a real engine's own
//! step timings, by ordinary least squares on
//! `duration = β0 + β1 · prefill tokens + β2 · decode tokens [+ β3 · context tokens]`.
//!
//! The input is the CSV the real-engine benchmark writes with `--steps-csv`
//! (`integrations/vllm/bench/real_engine.py`): a header naming at least
//! `dur_ms`, `prefill_tokens` and `decode_tokens`; a `context_tokens`
//! column, if present, fits β3 too. Fit on a quiet machine: on a shared one
//! other jobs' load is the largest term.

use std::fmt::Write as _;

/// A fit of the step-time model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fit {
    /// Fixed cost per step, ms.
    pub beta0_ms: f64,
    /// Per prefill token, µs.
    pub beta1_us: f64,
    /// Per decode token, µs.
    pub beta2_us: f64,
    /// Per context token read, µs (0 without a `context_tokens` column).
    pub beta3_us: f64,
    /// Steps fitted.
    pub steps: usize,
    /// Root-mean-square residual, ms.
    pub rms_ms: f64,
    /// Fraction of the variance explained.
    pub r2: f64,
}

/// Fits rows of `(duration ms, [prefill, decode, context?])`.
pub fn fit(rows: &[(f64, Vec<f64>)]) -> Result<Fit, String> {
    let k = rows.first().map_or(0, |r| r.1.len()) + 1;
    if rows.len() < k + 1 {
        return Err(format!(
            "{} steps are too few to fit {k} coefficients",
            rows.len()
        ));
    }
    // Normal equations (XᵀX) β = Xᵀy with a leading 1 for β0.
    let mut a = vec![vec![0.0; k + 1]; k];
    for (y, x) in rows {
        let row: Vec<f64> = std::iter::once(1.0).chain(x.iter().copied()).collect();
        for i in 0..k {
            for j in 0..k {
                a[i][j] += row[i] * row[j];
            }
            a[i][k] += row[i] * y;
        }
    }
    // Gauss-Jordan elimination with partial pivoting.
    for i in 0..k {
        let p = (i..k)
            .max_by(|&x, &y| a[x][i].abs().total_cmp(&a[y][i].abs()))
            .expect("rows");
        a.swap(i, p);
        if a[i][i].abs() < 1e-12 {
            return Err("the steps do not vary enough to fit every coefficient".into());
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
    let beta: Vec<f64> = (0..k).map(|i| a[i][k] / a[i][i]).collect();
    let mean = rows.iter().map(|r| r.0).sum::<f64>() / rows.len() as f64;
    let (mut ss_res, mut ss_tot) = (0.0, 0.0);
    for (y, x) in rows {
        let predicted = beta[0] + x.iter().zip(&beta[1..]).map(|(v, b)| v * b).sum::<f64>();
        ss_res += (y - predicted).powi(2);
        ss_tot += (y - mean).powi(2);
    }
    Ok(Fit {
        beta0_ms: beta[0],
        beta1_us: beta[1] * 1e3,
        beta2_us: beta[2] * 1e3,
        beta3_us: beta.get(3).map_or(0.0, |b| b * 1e3),
        steps: rows.len(),
        rms_ms: (ss_res / rows.len() as f64).sqrt(),
        r2: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            0.0
        },
    })
}

/// Reads the benchmark's step CSV (quoted fields allowed) and fits it.
pub fn fit_csv(text: &str) -> Result<Fit, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = split_csv(lines.next().ok_or("empty file")?);
    let col = |name: &str| header.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or(format!("no `{name}` column in the header"));
    let (dur, prefill, decode) = (
        need("dur_ms")?,
        need("prefill_tokens")?,
        need("decode_tokens")?,
    );
    let context = col("context_tokens");
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let cells = split_csv(line);
        let num = |i: usize| -> Result<f64, String> {
            cells.get(i).and_then(|c| c.parse().ok()).ok_or(format!(
                "line {}: column {} is not a number",
                n + 2,
                header[i]
            ))
        };
        let mut x = vec![num(prefill)?, num(decode)?];
        if let Some(c) = context {
            x.push(num(c)?);
        }
        rows.push((num(dur)?, x));
    }
    fit(&rows)
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

/// The fit as scenario-file lines plus its quality.
pub fn report(f: &Fit) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fitted {} steps: rms residual {:.2} ms, R² {:.3}",
        f.steps, f.rms_ms, f.r2
    );
    let _ = writeln!(out, "[engine]");
    let _ = writeln!(out, "beta0_ms = {:.3}", f.beta0_ms);
    let _ = writeln!(out, "beta1_us = {:.3}", f.beta1_us);
    let _ = writeln!(out, "beta2_us = {:.3}", f.beta2_us);
    let _ = writeln!(out, "beta3_us = {:.5}", f.beta3_us);
    if f.beta0_ms < 0.0 || f.beta1_us < 0.0 || f.beta2_us < 0.0 || f.beta3_us < 0.0 {
        out.push_str("warning: a negative coefficient: the timings are too noisy (a loaded machine?) to trust this fit\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_the_coefficients_of_synthetic_steps() {
        let mut csv = String::from("policy,t,dur_ms,prefill_tokens,decode_tokens\n");
        for i in 0..50u32 {
            let (p, d) = ((i * 37) % 2048, (i * 7) % 64);
            let ms = 4.0 + 0.06 * p as f64 + 0.2 * d as f64;
            csv.push_str(&format!("\"kvgate:wm=0.2,grace=1\",{i},{ms},{p},{d}\n"));
        }
        let f = fit_csv(&csv).unwrap();
        assert!((f.beta0_ms - 4.0).abs() < 1e-6, "{f:?}");
        assert!((f.beta1_us - 60.0).abs() < 1e-6, "{f:?}");
        assert!((f.beta2_us - 200.0).abs() < 1e-6, "{f:?}");
        assert!(f.r2 > 0.999999);
        assert!(report(&f).contains("beta1_us = 60.000"));
    }

    #[test]
    fn refuses_what_it_cannot_fit() {
        assert!(fit_csv("dur_ms,prefill_tokens\n1,2\n").is_err());
        assert!(fit_csv("dur_ms,prefill_tokens,decode_tokens\n1,2,3\n").is_err());
        let constant = "dur_ms,prefill_tokens,decode_tokens\n1,0,1\n2,0,1\n3,0,1\n4,0,1\n";
        assert!(fit_csv(constant).is_err());
    }
}
