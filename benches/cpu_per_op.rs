//! The open path at 1 and 8 threads, as wall time *and* CPU time per
//! operation, over several rounds (min and median), kvgate (Rust `Gate`, and
//! through the C ABI: `c_abi`) next to the naive baseline.
//!
//! Why next to criterion's `open_mt`: on a shared machine, wall time per
//! operation mixes the gate's own cost with how many cores other processes
//! leave free. CPU time per operation (this process's user + system time,
//! from `/proc/self/stat`) does not: if it grows from 1 to 8 threads, the
//! growth is contention (cache lines moving between cores, lock hand-offs).
//! Linux only; elsewhere it reports wall time alone.
//!
//! `cargo bench --bench cpu_per_op`. Under `cargo test` one small round runs.

mod common;

use std::thread;
use std::time::Instant;

use kvgate::{Config, Gate, Reason};

use common::naive::NaiveGate;
use common::{gate_cycle, naive_cycle, session_ids, Fixed};

const POOL: usize = 4096;

/// One open-path turn of thread `t`, its `k`-th.
type Op<'a> = &'a (dyn Fn(usize, u64) + Sync);

/// This process's CPU time so far (user + system), in seconds, if known.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may contain spaces) in `(...)`.
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ, 100 on Linux
}

/// (wall ns, CPU ns) per operation of one round: `threads` threads doing
/// `per_thread` operations each.
fn round(threads: usize, per_thread: u64, op: Op<'_>) -> (f64, Option<f64>) {
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || (0..per_thread).for_each(|k| op(t, k)));
        }
    });
    let ops = (threads as u64 * per_thread) as f64;
    let wall = start.elapsed().as_secs_f64() * 1e9 / ops;
    let cpu = cpu0.zip(cpu_seconds()).map(|(a, b)| (b - a) * 1e9 / ops);
    (wall, cpu)
}

fn min_median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}

fn main() {
    let bench = common::bench_mode();
    let (rounds, per_round) = if bench { (8, 2_400_000) } else { (1, 4_000) };
    let ids = session_ids("session", POOL);
    let kv = Gate::new(Config::reference(), Fixed::OPEN).expect("valid config");
    let naive = NaiveGate::new(&Config::reference(), Fixed::OPEN);
    let c_gate = common::c_abi::CGate::open();
    println!("open path, wall and CPU time per operation ({rounds} rounds: min / median)");
    let mut json = Vec::new();
    for threads in [1, 8] {
        let slice = POOL / threads;
        let kv_op =
            |t: usize, k: u64| gate_cycle(&kv, &ids[t * slice + k as usize % slice], Reason::Open);
        let naive_op = |t: usize, k: u64| {
            naive_cycle(&naive, &ids[t * slice + k as usize % slice], Reason::Open)
        };
        let c_op = |t: usize, k: u64| c_gate.cycle(&ids[t * slice + k as usize % slice]);
        let designs: [(&str, Op<'_>); 3] =
            [("kvgate", &kv_op), ("c_abi", &c_op), ("naive", &naive_op)];
        // Rounds alternate between the designs, so all see the same machine.
        let mut figures = vec![(Vec::new(), Vec::new()); designs.len()];
        for _ in 0..rounds {
            for (d, (_, op)) in designs.iter().enumerate() {
                let (wall, cpu) = round(threads, per_round / threads as u64, *op);
                figures[d].0.push(wall);
                figures[d].1.extend(cpu);
            }
        }
        for (d, (name, _)) in designs.iter().enumerate() {
            let (wall_min, wall_med) = min_median(figures[d].0.clone());
            let cpu = (!figures[d].1.is_empty()).then(|| min_median(figures[d].1.clone()));
            let cpu_text = cpu.map_or("n/a".into(), |(a, b)| format!("{a:6.1} / {b:6.1} ns"));
            println!(
                "  {name:<7} {threads} threads: wall {wall_min:6.1} / {wall_med:6.1} ns, CPU {cpu_text}"
            );
            json.push(format!(
                "    {{\"design\": \"{name}\", \"threads\": {threads}, \"wall_min_ns\": {wall_min:.1}, \
                 \"wall_median_ns\": {wall_med:.1}, \"cpu_min_ns\": {}, \"cpu_median_ns\": {}}}",
                cpu.map_or("null".into(), |c| format!("{:.1}", c.0)),
                cpu.map_or("null".into(), |c| format!("{:.1}", c.1)),
            ));
        }
    }
    if bench {
        common::write_results("cpu_per_op", &common::json_rows("cpu_per_op", &json));
    }
}
