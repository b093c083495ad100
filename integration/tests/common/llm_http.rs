//! The simulated provider of `llm.rs` behind a real axum server on 127.0.0.1, and the worker
//! pool of `llm::run` driving a client against it over real HTTP (hyper, one keep-alive
//! connection per worker), exactly, under paused time (`integration/tests/llm_http.rs`, by `#[path]`).
//!
//! # Why paused time stays exact over a socket
//!
//! The server runs in the client's runtime: one `current_thread` runtime with a paused clock.
//! tokio moves a paused clock forward only when the runtime parks with a timer pending and
//! nothing to run: `park_thread_timeout` in `runtime/time/mod.rs`, when `can_auto_advance`,
//! polls the I/O driver with a zero timeout, then advances the clock by the whole park duration
//! unless `did_wake` says a task was woken meanwhile. Before tokio 1.51.6 / 1.53.3 (tokio
//! #8595, "fix paused time auto-advancing when I/O wakes a task on `current_thread`") a task
//! woken by that very I/O poll did not count: a request written by the client sat in the
//! server's socket buffer while the clock jumped to the next timer. The manifest allows older
//! tokios (`1.44` for the tests, `1.47` for paced), so the harness does not lean on the fix.
//!
//! The [`Gate`] closes that gap. Every stretch of a call during which bytes are on the wire is
//! counted in flight: from just before the client sends until the server's handler has stamped
//! the arrival and created its latency timer, and from the moment that timer fires until the
//! client has read the whole response (and the set-up: binding, connecting, handshakes). While
//! anything is in flight, [`Gate::hold`] `yield_now`s in a loop, so the scheduler always has a
//! task ready and only ever parks through `park_yield`, with a zero timeout. A zero-timeout
//! park does not move the clock: `park_internal` clamps the park duration to
//! `min(limit, until the next timer)` = 0 and `park_thread_timeout(0)` advances the clock by
//! `Duration::ZERO` (`Clock::advance` adds the duration to its base); a due timer
//! (`duration == 0`) takes the branch that parks the I/O driver with a zero timeout and
//! advances nothing at all. The I/O driver is still polled on every such park, so the loopback
//! traffic flows. (Read in tokio 1.54.1's source, the version locked here.)
//!
//! So the server's arrival stamp equals the client's send instant, and the client reads the
//! answer at the instant the server's latency ended: [`run_http`] asserts both, call by call,
//! from stamps both sides record. Checked both ways: with tokio 1.54.1 the run is exact with
//! or without the gate (#8595 is in); with tokio 1.51.5 and the gate's `hold` disabled, the
//! first call of the table was read back 146 ms after the server answered it and the stamp
//! assertion failed (with the set-up ungated too, the month-long timeout fired during the
//! set-up); with 1.51.5 and the gate, the table came out exact and identical.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::llm::{
    Answered, Dialect, Outcome, Prompt, Provider, Scenario, REFUSAL_RTT, SECOND_NS, WORKERS,
};

/// Holds tokio's auto-advance off while HTTP bytes are in flight (see the module's
/// documentation).
#[derive(Debug, Default)]
pub struct Gate {
    in_flight: AtomicUsize,
    wake: Notify,
}

impl Gate {
    /// One more stretch in flight: the clock stands still until it [`leave`](Self::leave)s.
    pub fn enter(&self) {
        if self.in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
            // A permit is kept if the holder is not waiting yet: no lost wake-up.
            self.wake.notify_one();
        }
    }

    pub fn leave(&self) {
        let before = self.in_flight.fetch_sub(1, Ordering::SeqCst);
        assert!(before > 0, "the gate left more often than entered");
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Spawn this on the runtime: it keeps a task ready (so every park has a zero timeout)
    /// while anything is in flight, and sleeps on a `Notify` otherwise. Never returns.
    pub async fn hold(self: Arc<Self>) {
        loop {
            if self.in_flight() > 0 {
                tokio::task::yield_now().await;
            } else {
                self.wake.notified().await;
            }
        }
    }
}

/// One call as one side saw it: its id, and the instants (ns from the start) at which it was
/// sent (client) or arrived (server), and at which it was answered (server: its latency over)
/// or read back (client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    pub call: u64,
    pub arrived: u64,
    pub answered: u64,
    pub accepted: bool,
}

/// The provider behind axum on 127.0.0.1, in the caller's (paused, current-thread) runtime.
///
/// A call is a `GET /` with `x-call` (an id), `x-estimate`, `x-usage` (the true usage the
/// simulated model reports), `x-latency-ms` and `x-dialect` (`openai` or `ietf`). The provider
/// takes it at once ([`Provider::arrive`]); the answer comes after the latency, or after
/// [`REFUSAL_RTT`] for a 429, as `llm::run` has it. A 200 carries `x-usage-total-tokens`; a 429
/// carries `retry-after` (seconds, rounded up); both carry the quota headers as of the
/// arrival, in the dialect asked for.
pub struct Server {
    pub addr: SocketAddr,
    pub provider: Arc<Mutex<Provider>>,
    pub stamps: Arc<Mutex<Vec<Stamp>>>,
}

fn number(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn nanos(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).expect("centuries")
}

pub async fn serve(scenario: &Scenario, start: Instant, gate: Arc<Gate>) -> Server {
    let provider = Arc::new(Mutex::new(Provider::new(&scenario.limits)));
    let stamps = Arc::new(Mutex::new(Vec::new()));
    let (p, s) = (provider.clone(), stamps.clone());
    let app = Router::new().route(
        "/",
        get(move |request: HeaderMap| {
            let (provider, stamps, gate) = (p.clone(), s.clone(), gate.clone());
            async move {
                let arrived_at = nanos(start);
                let estimate = number(&request, "x-estimate");
                let usage = number(&request, "x-usage").min(estimate);
                let dialect = match request.get("x-dialect").map(|v| v.as_bytes()) {
                    Some(b"ietf") => Dialect::Ietf,
                    _ => Dialect::OpenAi,
                };
                let (arrived, announced) = {
                    let mut p = provider.lock().expect("provider");
                    let arrived = p.arrive(arrived_at, estimate);
                    (arrived, p.headers(arrived_at, dialect))
                };
                let hold = match arrived {
                    Ok(_) => Duration::from_millis(number(&request, "x-latency-ms")),
                    Err(_) => REFUSAL_RTT,
                };
                // The deadline is fixed here, at the arrival instant; then the clock may move.
                let latency = tokio::time::sleep(hold);
                gate.leave();
                latency.await;
                gate.enter();
                let answered = nanos(start);
                let mut headers = HeaderMap::new();
                for (name, value) in announced {
                    headers.insert(
                        HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
                        HeaderValue::from_str(&value).expect("a header value"),
                    );
                }
                stamps.lock().expect("stamps").push(Stamp {
                    call: number(&request, "x-call"),
                    arrived: arrived_at,
                    answered,
                    accepted: arrived.is_ok(),
                });
                match arrived {
                    Err(refusal) => {
                        if let Some(wait) = refusal.retry_after {
                            headers.insert("retry-after", wait.div_ceil(SECOND_NS).into());
                        }
                        (StatusCode::TOO_MANY_REQUESTS, headers, "rate limited")
                    }
                    Ok(ticket) => {
                        let mut p = provider.lock().expect("provider");
                        p.answer(answered, ticket, usage);
                        headers.insert("x-usage-total-tokens", usage.into());
                        (StatusCode::OK, headers, "ok")
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port on 127.0.0.1");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("the server") });
    Server {
        addr,
        provider,
        stamps,
    }
}

/// One keep-alive HTTP/1 connection to `addr` (its driver spawned on the runtime). Connect
/// while the gate is held.
pub async fn connect(addr: SocketAddr) -> SendRequest<Empty<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("a connection");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("a handshake");
    tokio::spawn(async move { connection.await.expect("the connection") });
    sender
}

/// Sends `request` and reads the whole answer, in flight for `gate` from just before the
/// send until the body is read.
pub async fn call(
    gate: &Gate,
    sender: &mut SendRequest<Empty<Bytes>>,
    request: http::Request<Empty<Bytes>>,
) -> (StatusCode, HeaderMap) {
    gate.enter();
    sender.ready().await.expect("the connection is ready");
    let response = sender.send_request(request).await.expect("an answer");
    let (parts, body) = response.into_parts();
    body.collect().await.expect("the body");
    gate.leave();
    (parts.status, parts.headers)
}

/// What a run over HTTP measured.
#[derive(Clone, Debug)]
pub struct HttpRun {
    pub outcome: Outcome,
    /// Calls sent (accepted and refused), each found with equal stamps on both sides.
    pub calls: usize,
}

/// `llm::run` over real HTTP: [`WORKERS`] workers, each on its own keep-alive connection to
/// the server, pull prompts from one FIFO queue. A call awaits `acquire(estimate)`, is sent
/// at once, and its answer is handed to `settle` with the grant: the usage read from the
/// response's `x-usage-total-tokens`, or `Refused` for a 429 (then sent again, through
/// `acquire` again). Run it on a paused current-thread runtime with I/O enabled.
///
/// Asserts that setting up the server and the connections took no time on the clock, and
/// that every call arrived at the server at the instant the client sent it and came back at
/// the instant the server answered it.
pub async fn run_http<G, A, F, S>(
    prompts: &[Prompt],
    scenario: &Scenario,
    dialect: Dialect,
    acquire: A,
    settle: S,
) -> HttpRun
where
    A: Fn(u64) -> F,
    F: Future<Output = G>,
    S: Fn(G, Answered),
{
    let start = Instant::now();
    let gate = Arc::new(Gate::default());
    tokio::spawn(gate.clone().hold());
    // The set-up is in flight too: no timer may fire before the first call.
    gate.enter();
    let server = serve(scenario, start, gate.clone()).await;
    let mut senders = Vec::with_capacity(WORKERS);
    for _ in 0..WORKERS {
        senders.push(connect(server.addr).await);
    }
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the set-up took clock time"
    );
    gate.leave();

    // Every answer (200 or 429) announces the limits in the dialect asked for.
    let (dialect, announced) = match dialect {
        Dialect::OpenAi => (
            "openai",
            [
                "x-ratelimit-remaining-requests",
                "x-ratelimit-remaining-tokens",
            ],
        ),
        Dialect::Ietf => ("ietf", ["ratelimit-policy", "ratelimit"]),
    };
    let next = Cell::new(0);
    let calls = Cell::new(0);
    let last = Cell::new(0);
    let sent = RefCell::new(Vec::new());
    let worker = |mut sender: SendRequest<Empty<Bytes>>| {
        let (gate, acquire, settle) = (&gate, &acquire, &settle);
        let (next, calls, last, sent) = (&next, &calls, &last, &sent);
        async move {
            loop {
                let i = next.get();
                let Some(p) = prompts.get(i) else { break };
                next.set(i + 1);
                loop {
                    let grant = acquire(p.estimate).await;
                    let id = calls.get();
                    calls.set(id + 1);
                    let request = http::Request::get("/")
                        .header("host", "127.0.0.1")
                        .header("x-call", id)
                        .header("x-estimate", p.estimate)
                        .header("x-usage", p.charged(scenario.settles))
                        .header("x-latency-ms", p.latency_ms)
                        .header("x-dialect", dialect)
                        .body(Empty::new())
                        .expect("a request");
                    let at = nanos(start);
                    let (status, headers) = call(gate, &mut sender, request).await;
                    let back = nanos(start);
                    for name in announced {
                        assert!(headers.contains_key(name), "no {name}");
                    }
                    let usage = headers
                        .get("x-usage-total-tokens")
                        .map(|v| v.to_str().expect("ascii").parse::<u64>().expect("a number"));
                    let accepted = status == StatusCode::OK;
                    sent.borrow_mut().push(Stamp {
                        call: id,
                        arrived: at,
                        answered: back,
                        accepted,
                    });
                    if accepted {
                        let usage = usage.expect("a 200 reports its usage");
                        settle(grant, Answered::Ok { usage });
                        last.set(last.get().max(back));
                        break;
                    }
                    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                    settle(grant, Answered::Refused);
                }
            }
        }
    };
    futures_util::future::join_all(senders.into_iter().map(worker)).await;

    let mut client = sent.into_inner();
    let mut server_side = server.stamps.lock().expect("stamps").clone();
    client.sort_unstable();
    server_side.sort_unstable();
    assert_eq!(client.len(), server_side.len(), "calls lost on the way");
    for (c, s) in client.iter().zip(&server_side) {
        assert_eq!(
            c, s,
            "the call as the client (left) and the server (right) saw it"
        );
    }
    let provider = server.provider.lock().expect("provider");
    assert_eq!(provider.accepted, prompts.len() as u64);
    HttpRun {
        outcome: Outcome {
            refusals: provider.refused,
            makespan: last.get(),
        },
        calls: client.len(),
    }
}

/// A paused current-thread runtime with I/O and time, for one run from clock 0.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}
