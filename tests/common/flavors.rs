//! One async test on every runtime flavor: a current-thread runtime, and multi-thread runtimes
//! of 2 and 8 workers (tokio's default `#[tokio::main]` is multi-thread). For the Redis tests
//! that check a bound or an order: tasks spawned in order run in any order on several workers.

use std::future::Future;

/// Runs `test` to completion on a runtime of `workers` worker threads (0: current-thread).
pub fn run<F: Future<Output = ()>>(workers: usize, test: fn() -> F) {
    let mut builder = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    builder.enable_all().build().unwrap().block_on(test());
}

/// For each `async fn name()` given, a module `name` of three tests: `current_thread`,
/// `two_workers` and `eight_workers`.
macro_rules! on_every_flavor {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn current_thread() {
                crate::flavors::run(0, super::$name)
            }
            #[test]
            fn two_workers() {
                crate::flavors::run(2, super::$name)
            }
            #[test]
            fn eight_workers() {
                crate::flavors::run(8, super::$name)
            }
        }
    )*};
}
