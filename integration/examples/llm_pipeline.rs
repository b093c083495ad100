//! An ETL stage that sends prompts to an LLM API limited per minute AND per day, on requests
//! AND tokens, paced by one `RateLimiter<[u64; 2]>` and never refused.
//!
//! The example starts its own OpenAI-style server on 127.0.0.1 (axum, in process). The server
//! enforces four limits exactly, refusing a call with 429 when any of them lacks room:
//!
//! - requests per minute and tokens per minute: token buckets that refill continuously (as
//!   OpenAI's and Anthropic's per-minute limits do), full at `limit`;
//! - requests per day and tokens per day: fixed windows that reset at midnight UTC.
//!
//! A call charges the server 1 request and an estimate of its tokens on arrival (the prompt's
//! tokens plus `max_tokens`: an estimate from above, known before the call runs), and the
//! answer gives back what the model did not use: its usage comes in the
//! `x-usage-total-tokens` header. The server announces the per-minute limits in OpenAI's
//! headers (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`) and the daily ones in the
//! same form with a `-day` suffix (OpenAI names one limit per dimension). Bodies are plain
//! text; there is no JSON.
//!
//! The client does as the server does: `llm.acquire([1, estimate])` before each call, then
//! `permit.settle([1, usage])` from the answer, so the unused tokens are back in both at once.
//!
//! **Time runs 60 times fast**: a minute lasts one real second (so "120 requests per minute"
//! is `Rate::per_second(120)`), and the run starts two (scaled) minutes before midnight UTC,
//! so the daily caps bind before midnight and reset during the run. The whole run takes about
//! 3 s of real time.
//!
//! **A margin for the network.** The limiter grants a call at one instant and the server
//! counts it a little later; when a call takes longer on the way than the one after it, the
//! server's bucket has lost a little refill that the client counted on. The client's
//! per-minute buckets are therefore 5 % smaller than the server's (50 ms of refill), which
//! absorbs up to 50 ms of difference in delay. Without it (tokens bind at the server all the
//! time, and a millisecond of jitter is 40 tokens) the server refused 46 to 88 calls in runs of
//! 360 prompts. The daily windows need no margin here: the caps bind well before midnight, so no
//! call is granted before it and counted after it.
//!
//! ```text
//! cargo run -p paced-integration --example llm_pipeline
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::post;
use axum::Router;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use paced::{Limit, Rate, RateLimiter};
use tokio::time::Instant;

/// A scaled minute, in real time.
const MINUTE: Duration = Duration::from_secs(1);
/// A scaled day: 1,440 scaled minutes.
const DAY: Duration = Duration::from_secs(1_440);
/// The run starts this long before midnight (two scaled minutes).
const BEFORE_MIDNIGHT: Duration = Duration::from_secs(2);

/// The account's limits, as the server enforces them.
const REQUESTS_PER_MINUTE: u64 = 120;
const TOKENS_PER_MINUTE: u64 = 40_000;
const REQUESTS_PER_DAY: u64 = 200;
const TOKENS_PER_DAY: u64 = 80_000;
/// The client's per-minute buckets hold this much less than the server's (in thousandths):
/// 50 ms of refill, for the differences in network delay.
const MARGIN_PERMILLE: u64 = 50;

// At most 200 (a day's requests) are left for after midnight as long as 100 go before it: a
// slow machine cannot leave more than a day's cap for the new day (it would wait a scaled day).
const PROMPTS: u64 = 300;
/// Calls in flight at once.
const IN_FLIGHT: usize = 32;
/// The most a completion may use, sent with each call.
const MAX_TOKENS: u64 = 400;

/// Prints a line prefixed with the real time elapsed since `start`.
macro_rules! log {
    ($start:expr, $($arg:tt)*) => {
        println!("[{:>6.3}s] {}", $start.elapsed().as_secs_f64(), format_args!($($arg)*))
    };
}

#[tokio::main]
async fn main() {
    let start = Instant::now();
    let midnight = start + BEFORE_MIDNIGHT;
    let server = Arc::new(Mutex::new(Server::new(start, midnight)));
    let addr = serve(Arc::clone(&server)).await;
    log!(
        start,
        "{PROMPTS} prompts to http://{addr}; time runs 60x fast (a minute lasts 1 s), \
         23:58 UTC"
    );

    // The client: the server's limits, the per-minute ones less the margin, the daily ones
    // aligned to the same midnight (`aligned_to` a `SystemTime` in production; the default,
    // the Unix epoch, puts a day's boundary at midnight UTC).
    let margin = |limit: u64| limit - limit * MARGIN_PERMILLE / 1_000;
    let llm: RateLimiter<[u64; 2]> = RateLimiter::builder(["requests", "tokens"])
        .limit(
            "requests",
            Limit::bucket(
                Rate::per_second(REQUESTS_PER_MINUTE),
                margin(REQUESTS_PER_MINUTE),
            ),
        )
        .limit(
            "tokens",
            Limit::bucket(
                Rate::per_second(TOKENS_PER_MINUTE),
                margin(TOKENS_PER_MINUTE),
            ),
        )
        .limit(
            "requests",
            Limit::window(REQUESTS_PER_DAY, DAY).aligned_to_instant(midnight),
        )
        .limit(
            "tokens",
            Limit::window(TOKENS_PER_DAY, DAY).aligned_to_instant(midnight),
        )
        .build()
        .expect("valid limits");

    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let announced = Arc::new(Mutex::new(None));
    let (mut announced_logged, mut midnight_logged) = (false, false);
    let mut answers = futures_util::stream::iter(1..=PROMPTS)
        .map(|id| {
            let (llm, http, announced) = (llm.clone(), http.clone(), Arc::clone(&announced));
            async move {
                let prompt = prompt(id);
                let estimate = count_tokens(&prompt) + MAX_TOKENS;
                let permit = llm.acquire([1, estimate]).await;
                let request = http::Request::post(format!("http://{addr}/v1/completions"))
                    .header("x-max-tokens", MAX_TOKENS)
                    .body(Full::new(Bytes::from(prompt)))
                    .expect("a valid request");
                let response = http.request(request).await.expect("the server answers");
                let status = response.status();
                let headers = response.headers().clone();
                let _completion = response.into_body().collect().await.expect("a body");
                if status == StatusCode::TOO_MANY_REQUESTS {
                    // Refused: the server charged nothing, so neither does the limiter.
                    permit.settle([0, 0]);
                    return (id, None);
                }
                let usage = number(&headers, "x-usage-total-tokens");
                permit.settle([1, usage]);
                announced.lock().unwrap().get_or_insert(headers);
                (id, Some(usage))
            }
        })
        .buffer_unordered(IN_FLIGHT);

    let (mut answered, mut refused) = (0, 0);
    while let Some((id, usage)) = answers.next().await {
        match usage {
            Some(_) => answered += 1,
            None => {
                refused += 1;
                log!(start, "prompt {id}: 429");
            }
        }
        if !announced_logged && answered > 0 {
            announced_logged = true;
            let headers = announced.lock().unwrap().clone().expect("an answer");
            log!(
                start,
                "the server announces {} requests/min, {} tokens/min, {} requests/day, \
                 {} tokens/day",
                number(&headers, "x-ratelimit-limit-requests"),
                number(&headers, "x-ratelimit-limit-tokens"),
                number(&headers, "x-ratelimit-limit-requests-day"),
                number(&headers, "x-ratelimit-limit-tokens-day"),
            );
        }
        if !midnight_logged && Instant::now() >= midnight {
            midnight_logged = true;
            log!(start, "midnight UTC: the daily limits start again");
        }
    }
    let elapsed = start.elapsed();
    log!(start, "{answered} prompts answered, {refused} refused");

    // What the server counted, beside each limit's bound.
    let server = server.lock().unwrap();
    let minutes = elapsed.as_secs_f64() / MINUTE.as_secs_f64();
    println!();
    println!("limit (as the server counted)          used     bound");
    for (name, used, rate) in [
        (
            "requests per minute",
            server.requests.total,
            REQUESTS_PER_MINUTE,
        ),
        ("tokens per minute", server.tokens.total, TOKENS_PER_MINUTE),
    ] {
        // A bucket: at most burst + elapsed × rate over the run.
        let bound = rate as f64 * (1.0 + minutes);
        println!(
            "{name:<20} over {minutes:.2} min {used:>9} {bound:>9.0}   ({rate} + {minutes:.2} min x {rate})"
        );
    }
    for (name, days, quota) in [
        (
            "requests per day",
            &server.requests_per_day,
            REQUESTS_PER_DAY,
        ),
        ("tokens per day", &server.tokens_per_day, TOKENS_PER_DAY),
    ] {
        for (day, used) in days.used_per_window() {
            let label = if day == 0 {
                "until 24:00"
            } else {
                "from 00:00"
            };
            println!("{name:<20} {label:<12} {used:>9} {quota:>9}");
        }
    }
    println!("429s: {}", server.refused);
    assert_eq!(server.refused, 0, "the limiter kept every limit");
}

/// Prompt `id`: a record to summarise, 50 to 249 words long.
fn prompt(id: u64) -> String {
    let words = 50 + (id * 7_919) % 200;
    let mut prompt = format!("Summarise record {id}:");
    for w in 0..words {
        prompt.push_str(if w % 2 == 0 { " lorem" } else { " ipsum" });
    }
    prompt
}

/// The toy tokenizer both sides use: one token per word.
fn count_tokens(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// A header's value as a number, or 0.
fn number(headers: &HeaderMap, name: &str) -> u64 {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// The server: an OpenAI-style completions endpoint with exact limits.
// ---------------------------------------------------------------------------------------------

/// Starts the server on 127.0.0.1, port 0, and returns its address.
async fn serve(server: Arc<Mutex<Server>>) -> std::net::SocketAddr {
    let app = Router::new().route(
        "/v1/completions",
        post(move |request: HeaderMap, prompt: String| {
            let server = Arc::clone(&server);
            async move {
                let prompt_tokens = count_tokens(&prompt);
                let max_tokens = number(&request, "x-max-tokens");
                let estimate = prompt_tokens + max_tokens;
                let (admitted, mut headers) = {
                    let mut s = server.lock().unwrap();
                    let admitted = s.arrive(estimate);
                    (admitted, s.announce())
                };
                let Some(charged_at) = admitted else {
                    return (StatusCode::TOO_MANY_REQUESTS, headers, String::new());
                };
                // The model writes 50 to `max_tokens` tokens, a millisecond per 20.
                let completion = (50 + prompt_tokens * 31 % 351).min(max_tokens);
                tokio::time::sleep(Duration::from_millis(5 + completion / 20)).await;
                let usage = prompt_tokens + completion;
                server.lock().unwrap().answer(charged_at, estimate, usage);
                headers.insert("x-usage-total-tokens", usage.into());
                let text = " summary".repeat(completion as usize);
                (StatusCode::OK, headers, text)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("the server runs") });
    addr
}

/// The server's state: two buckets and two fixed windows, counted in nanoseconds since the
/// start, and the calls it refused.
struct Server {
    start: Instant,
    requests: Bucket,
    tokens: Bucket,
    requests_per_day: Window,
    tokens_per_day: Window,
    refused: u64,
}

impl Server {
    fn new(start: Instant, midnight: Instant) -> Server {
        let minute = MINUTE.as_nanos() as u64;
        let phase = (midnight - start).as_nanos() as u64;
        Server {
            start,
            requests: Bucket::new(REQUESTS_PER_MINUTE, minute),
            tokens: Bucket::new(TOKENS_PER_MINUTE, minute),
            requests_per_day: Window::new(REQUESTS_PER_DAY, DAY.as_nanos() as u64, phase),
            tokens_per_day: Window::new(TOKENS_PER_DAY, DAY.as_nanos() as u64, phase),
            refused: 0,
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Charges 1 request and `estimate` tokens to every limit if all have room; otherwise
    /// counts a refusal and charges nothing. Returns when the call was charged.
    fn arrive(&mut self, estimate: u64) -> Option<u64> {
        let now = self.now();
        let room = self.requests.has_room(now, 1)
            && self.tokens.has_room(now, estimate)
            && self.requests_per_day.has_room(now, 1)
            && self.tokens_per_day.has_room(now, estimate);
        if !room {
            self.refused += 1;
            return None;
        }
        self.requests.charge(now, 1);
        self.tokens.charge(now, estimate);
        self.requests_per_day.charge(now, 1);
        self.tokens_per_day.charge(now, estimate);
        Some(now)
    }

    /// Gives back the tokens the call did not use.
    fn answer(&mut self, charged_at: u64, estimate: u64, usage: u64) {
        let now = self.now();
        let unused = estimate.saturating_sub(usage);
        self.tokens.refund(now, unused);
        self.tokens_per_day.refund(now, charged_at, unused);
    }

    /// The limits as OpenAI's headers say them (and the daily ones with a `-day` suffix).
    fn announce(&mut self) -> HeaderMap {
        let now = self.now();
        let mut headers = HeaderMap::new();
        let mut put = |name: &str, value: String| {
            let name = axum::http::HeaderName::from_bytes(name.as_bytes()).expect("a name");
            headers.insert(name, HeaderValue::from_str(&value).expect("a value"));
        };
        for (what, bucket) in [("requests", &self.requests), ("tokens", &self.tokens)] {
            put(
                &format!("x-ratelimit-limit-{what}"),
                bucket.burst.to_string(),
            );
            let remaining = bucket.remaining(now);
            put(
                &format!("x-ratelimit-remaining-{what}"),
                remaining.to_string(),
            );
            put(
                &format!("x-ratelimit-reset-{what}"),
                go(bucket.until_full(now)),
            );
        }
        for (what, window) in [
            ("requests", &mut self.requests_per_day),
            ("tokens", &mut self.tokens_per_day),
        ] {
            put(
                &format!("x-ratelimit-limit-{what}-day"),
                window.quota.to_string(),
            );
            let remaining = window.remaining(now);
            put(
                &format!("x-ratelimit-remaining-{what}-day"),
                remaining.to_string(),
            );
            put(
                &format!("x-ratelimit-reset-{what}-day"),
                go(window.until_next(now)),
            );
        }
        headers
    }
}

/// A token bucket as a theoretical arrival time (GCRA): full while `tat <= now`; each unit
/// costs `per_unit` nanoseconds of refill.
struct Bucket {
    burst: u64,
    per_unit: u64,
    tat: u64,
    /// Charged less given back, over the run.
    total: u64,
}

impl Bucket {
    /// A bucket of `limit` per `period` (nanoseconds), full at `limit`.
    fn new(limit: u64, period: u64) -> Bucket {
        Bucket {
            burst: limit,
            per_unit: period / limit,
            tat: 0,
            total: 0,
        }
    }

    fn has_room(&self, now: u64, cost: u64) -> bool {
        self.tat.max(now) + cost * self.per_unit <= now + self.burst * self.per_unit
    }

    fn charge(&mut self, now: u64, cost: u64) {
        self.tat = self.tat.max(now) + cost * self.per_unit;
        self.total += cost;
    }

    /// Gives `amount` back, never above a full bucket.
    fn refund(&mut self, now: u64, amount: u64) {
        self.tat = self.tat.saturating_sub(amount * self.per_unit).max(now);
        self.total -= amount;
    }

    fn remaining(&self, now: u64) -> u64 {
        let lacking = (self.tat.saturating_sub(now)).div_ceil(self.per_unit);
        self.burst.saturating_sub(lacking)
    }

    fn until_full(&self, now: u64) -> Duration {
        Duration::from_nanos(self.tat.saturating_sub(now))
    }
}

/// A fixed window of `len` nanoseconds whose boundaries fall at `phase + k * len` (here,
/// midnight), remembering what each window used.
struct Window {
    quota: u64,
    len: u64,
    phase: u64,
    /// Used, per window index (0: the day the run starts in).
    used: Vec<u64>,
}

impl Window {
    fn new(quota: u64, len: u64, phase: u64) -> Window {
        Window {
            quota,
            len,
            phase,
            used: vec![0],
        }
    }

    /// The index of the window `now` falls in.
    fn index(&self, now: u64) -> usize {
        ((now + self.len - self.phase) / self.len) as usize
    }

    fn current(&mut self, now: u64) -> &mut u64 {
        let i = self.index(now);
        if self.used.len() <= i {
            self.used.resize(i + 1, 0);
        }
        &mut self.used[i]
    }

    fn has_room(&mut self, now: u64, cost: u64) -> bool {
        let quota = self.quota;
        *self.current(now) + cost <= quota
    }

    fn charge(&mut self, now: u64, cost: u64) {
        *self.current(now) += cost;
    }

    /// Gives `amount` back if the window of `charged_at` is still the current one.
    fn refund(&mut self, now: u64, charged_at: u64, amount: u64) {
        if self.index(now) == self.index(charged_at) {
            *self.current(now) -= amount;
        }
    }

    fn remaining(&mut self, now: u64) -> u64 {
        let quota = self.quota;
        quota.saturating_sub(*self.current(now))
    }

    fn until_next(&self, now: u64) -> Duration {
        let next = self.phase + self.index(now) as u64 * self.len;
        Duration::from_nanos(next - now)
    }

    fn used_per_window(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.used.iter().copied().enumerate()
    }
}

/// A duration as Go prints one, as OpenAI's resets are written (`20ms`, `1.5s`, `6m0s`,
/// `1h2m3.5s`), to the millisecond.
fn go(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let (h, m, s) = (ms / 3_600_000, ms / 60_000 % 60, ms % 60_000);
    let secs = format!("{}.{:03}", s / 1_000, s % 1_000);
    let secs = secs.trim_end_matches('0').trim_end_matches('.');
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}
