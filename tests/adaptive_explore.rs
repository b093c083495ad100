mod common;
#[path = "common/provider.rs"]
mod provider;
use common::paused;
use provider::*;
#[test]
fn explore() {
    let v: Vec<f64> = std::env::var("SC").unwrap().split(',').map(|x| x.parse().unwrap()).collect();
    let (l, lat, c, ra) = (v[0], v[1] as u64, v[2] as usize, v[3] > 0.0);
    let mut s = Scenario::new(l, lat, c, ra);
    s.duration = std::time::Duration::from_secs(v[4] as u64);
    if v.len() > 5 { s.changes = vec![(std::time::Duration::from_secs(60), v[5])]; }
    let run = paused(simulate(&s));
    let r = check_windows(&run, 20, s.duration.as_secs() as usize, s.limit, if ra {0.9} else {0.85}, if ra {0.05} else {0.10});
    println!("{:?} {:?}", r, run.stats);
    println!("  ok {:?}\n  no {:?}\n  rate {:?}", run.ok, run.refused, run.rate.iter().map(|r| (r*10.0).round()/10.0).collect::<Vec<_>>());
}
