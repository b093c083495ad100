//! [`RateLimitLayer`]: wraps a service in a [`RateLimit`] over a shared limiter.

use std::fmt;
use std::marker::PhantomData;

use tower_layer::Layer;

use super::service::RateLimit;
use crate::limiter::{KeyedLimiter, Limiter};
use crate::mode::{Enforcing, Shaping};
use crate::tower::request::sealed::Answered;
use crate::tower::request::{ByKey, KeepCharge, OnePerRequest, SettleFrom};
#[cfg(doc)]
use crate::{KeyedRateLimiter, RateLimiter};

/// A tower [`Layer`] that makes every request draw its cost from a limiter shared by handle
/// before it reaches the inner service.
///
/// - [`new(&limiter)`](RateLimitLayer::new) draws on a [`RateLimiter`](crate::RateLimiter), a
///   [`Stagger`](crate::Stagger), a [`RateLimiter`] (several limits at once) or a
///   `RedisRateLimiter`;
///   [`keyed(&limiter, key)`](RateLimitLayer::keyed) on one key's bucket of a
///   [`KeyedRateLimiter`](crate::KeyedRateLimiter) or a `RedisKeyedRateLimiter` (any
///   [`KeyedLimiter`]), the key computed from the request.
/// - [`cost(|req| ..)`](RateLimitLayer::cost) sets what a request costs (default 1; one
///   amount per dimension, `[u64; N]`, over a [`RateLimiter`] or a
///   [`KeyedRateLimiter`]), and, over either of those,
///   [`settle(|response| ..)`](RateLimitLayer::settle) corrects the charge from the response
///   (on the request's key, for the keyed one).
/// - Shaping by default: a request waits for its tokens, FIFO with every other user of the
///   limiter (in the order the response futures are first polled), then is passed on.
///   [`enforcing()`](RateLimitLayer::enforcing) refuses a request that does not conform at
///   once with [`RateLimited`](crate::tower::RateLimited) instead.
///
/// A request is charged when it is granted; a response future dropped before that gives its
/// place to the next waiter and is charged nothing. See [`RateLimit`] for how waiting and
/// `poll_ready` interact.
///
/// # Examples
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use paced::tower::RateLimitLayer;
/// use paced::{Rate, RateLimiter};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tokio::time::Instant;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 100 bytes per second, bursts of 100; each request costs its length.
/// let limiter = RateLimiter::new(Rate::per_second(100), 100);
/// let upload = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(&limiter).cost(|body: &Vec<u8>| body.len() as u64))
///     .service_fn(|body: Vec<u8>| async move { Ok::<_, Infallible>(body.len()) });
/// let start = Instant::now();
/// assert_eq!(upload.clone().oneshot(vec![0; 100]).await.unwrap(), 100);
/// assert_eq!(upload.oneshot(vec![0; 50]).await.unwrap(), 50);
/// assert_eq!(start.elapsed(), Duration::from_millis(500));
/// # }
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct RateLimitLayer<Q, C = OnePerRequest, M = Shaping, A = KeepCharge> {
    limiter: Q,
    cost: C,
    mode: M,
    answered: A,
}

impl<Q: Limiter> RateLimitLayer<Q> {
    /// A shaping layer over `limiter`, one token per request (over a [`RateLimiter`],
    /// say what a request costs in each dimension with [`cost`](RateLimitLayer::cost)).
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::RateLimitLayer;
    /// use paced::{Rate, Stagger};
    /// use std::time::Duration;
    ///
    /// // At most 3 connections opened in any second.
    /// let window = Stagger::new(3, Duration::from_secs(1));
    /// let _layer = RateLimitLayer::new(&window);
    /// ```
    pub fn new(limiter: &Q) -> Self {
        RateLimitLayer {
            limiter: limiter.clone(),
            cost: OnePerRequest,
            mode: Shaping,
            answered: KeepCharge,
        }
    }
}

impl<F, Q: KeyedLimiter> RateLimitLayer<ByKey<Q::Key, F, Q::Hasher, Q>> {
    /// A shaping layer over `limiter`, one bucket per key: `key(&req)` says whose bucket a
    /// request draws on (a client's IP address or API key, a tenant, a destination host).
    /// Requests of different keys never wait for each other.
    ///
    /// `limiter` is any [`KeyedLimiter`]: a [`KeyedRateLimiter`](crate::KeyedRateLimiter) of one
    /// limit per key or of several (a cost of `[u64; N]`, settled from the response with
    /// [`settle`](RateLimitLayer#method.settle-1)) or,
    /// with the `redis` feature, a `RedisKeyedRateLimiter` whose per-key limiters a whole fleet
    /// of servers shares. Over Redis, a shaping request waits by the Redis limiter's own
    /// `acquire` (leases, retries and failure policy included), and an enforcing one is
    /// decided by its `try_acquire` (one round trip; a refusal writes nothing): refused with
    /// its [`NotUntil`](crate::NotUntil), or, on a Redis reply error for the key (counted and
    /// logged by the limiter), with a `retry_after` of 1 s. An announcing layer
    /// ([`headers`](RateLimitLayer::headers)) announces the request's key's bucket, or, over a
    /// `KeyedRateLimiter<K, [u64; N]>`, every limit of the key; it sends only `Retry-After` for a
    /// Redis limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use paced::tower::RateLimitLayer;
    /// use paced::{KeyedRateLimiter, Rate};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// type Url = (&'static str, &'static str); // (host, path)
    /// let per_host = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// let fetch = ServiceBuilder::new()
    ///     .layer(RateLimitLayer::keyed(&per_host, |url: &Url| url.0))
    ///     .service_fn(|url: Url| async move { Ok::<_, Infallible>(url.1) });
    /// let start = Instant::now();
    /// fetch.clone().oneshot(("a.example", "/1")).await.unwrap();
    /// fetch.clone().oneshot(("b.example", "/1")).await.unwrap(); // another bucket
    /// assert_eq!(start.elapsed(), Duration::ZERO);
    /// fetch.oneshot(("a.example", "/2")).await.unwrap();
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # }
    /// ```
    pub fn keyed(limiter: &Q, key: F) -> Self {
        RateLimitLayer {
            limiter: ByKey {
                limiter: limiter.clone(),
                key,
                types: PhantomData,
            },
            cost: OnePerRequest,
            mode: Shaping,
            answered: KeepCharge,
        }
    }
}

impl<Q, C, M, A> RateLimitLayer<Q, C, M, A> {
    /// Makes each request cost `cost(&req)` tokens instead of one (over a [`RateLimiter`],
    /// one amount per dimension: `|req| [1, estimate(req)]`). A cost of 0 passes at once;
    /// a cost above the burst waits until it has paid its debt (shaping) or is refused with
    /// `retry_after() == Duration::MAX` (enforcing). A [`Stagger`](crate::Stagger) counts one
    /// per request whatever the cost.
    ///
    /// # Examples
    ///
    /// ```
    /// use paced::tower::RateLimitLayer;
    /// use paced::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Rate::per_second(1_000), 1_000);
    /// // Batch requests cost one token per item.
    /// let _layer = RateLimitLayer::new(&limiter).cost(|batch: &Vec<String>| batch.len() as u64);
    /// ```
    pub fn cost<C2>(self, cost: C2) -> RateLimitLayer<Q, C2, M, A> {
        RateLimitLayer {
            limiter: self.limiter,
            cost,
            mode: self.mode,
            answered: self.answered,
        }
    }

    /// The enforcing flavour, for servers: a request that does not conform when it arrives
    /// (tokens there and nobody waiting) is refused at once with
    /// [`RateLimited`](crate::tower::RateLimited), charged nothing, and the inner service is not
    /// called. The service's error type becomes [`BoxError`](crate::tower::BoxError).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use paced::tower::{RateLimitLayer, RateLimited};
    /// use paced::{KeyedRateLimiter, Rate};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// // Each API key: 1 request per second.
    /// type Request = (u32, &'static str); // (API key, body)
    /// let per_client = KeyedRateLimiter::new(Rate::per_second(1), 1);
    /// let api = ServiceBuilder::new()
    ///     .layer(RateLimitLayer::keyed(&per_client, |req: &Request| req.0).enforcing())
    ///     .service_fn(|req: Request| async move { Ok::<_, Infallible>(req.1) });
    /// assert_eq!(api.clone().oneshot((1, "hello")).await.unwrap(), "hello");
    /// let err = api.clone().oneshot((1, "again")).await.unwrap_err();
    /// assert!(err.is::<RateLimited>());
    /// assert_eq!(api.oneshot((2, "other client")).await.unwrap(), "other client");
    /// # }
    /// ```
    pub fn enforcing(self) -> RateLimitLayer<Q, C, Enforcing, A> {
        RateLimitLayer {
            limiter: self.limiter,
            cost: self.cost,
            mode: Enforcing,
            answered: self.answered,
        }
    }

    /// The same layer, doing `answered` with each answer.
    fn answering<A2>(self, answered: A2) -> RateLimitLayer<Q, C, M, A2> {
        RateLimitLayer {
            limiter: self.limiter,
            cost: self.cost,
            mode: self.mode,
            answered,
        }
    }
}

mod sealed {
    /// The modes whose layer can settle a request's charge from its response: shaping and
    /// enforcing, not announcing.
    pub trait Settles {}
}

impl sealed::Settles for Shaping {}
impl sealed::Settles for Enforcing {}

impl<Q: Limiter, C, M: sealed::Settles> RateLimitLayer<Q, C, M> {
    /// Settles each request's charge from its response: once the inner service answers
    /// `Ok(response)`, the request's [`Permit`](crate::limiter::Permit) is settled with
    /// `settle(&response)`, the cost it really had (the usage an LLM answer reports). A
    /// smaller amount gives the difference back at once (the waiters it admits go at that
    /// instant), a larger one is charged as debt, as [`Permit::settle`](crate::limiter::Permit::settle)
    /// does. An `Err` from the inner service, or a response future dropped before the answer,
    /// keeps the charge: what the estimate took stays taken.
    ///
    /// For a layer over a several-limit [`RateLimiter`], shaping or enforcing, or over a
    /// several-limit `RedisRateLimiter` (feature `redis`), which settles in Redis in the
    /// background: one round trip after the answer, the response going on at once. An
    /// announcing layer
    /// ([`headers`](RateLimitLayer::headers)) does not settle, and the two do not combine
    /// (neither order compiles): `settle` is for a client, whose cost is an estimate until the
    /// answer says what it was; a server that charges what it serves knows the cost from the
    /// request (its size, the tokens it asks for), and one that learns it only from its own
    /// answer charges the request's estimate with [`cost`](RateLimitLayer::cost) and
    /// corrects it in its handler with
    /// [`RateLimiter::acquire`](crate::RateLimiter#method.acquire-1) and
    /// [`Permit::settle`](crate::limiter::Permit::settle) instead of the layer.
    ///
    /// ```compile_fail
    /// use paced::tower::{QuotaHeaders, RateLimitLayer};
    /// use paced::{Limit, RateLimiter, Rate};
    ///
    /// let quota = RateLimiter::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// let _ = RateLimitLayer::new(&quota)
    ///     .enforcing()
    ///     .headers(QuotaHeaders::Draft)
    ///     .settle(|_: &http::Response<()>| [1]); // an announcing layer does not settle
    /// ```
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use paced::tower::RateLimitLayer;
    /// use paced::{Limit, RateLimiter, Rate};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// struct Answer {
    ///     tokens_used: u64,
    /// }
    /// let llm = RateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 1_000))
    ///     .build()
    ///     .unwrap();
    /// let complete = ServiceBuilder::new()
    ///     .layer(
    ///         RateLimitLayer::new(&llm)
    ///             .cost(|_prompt: &&str| [1, 1_000]) // a generous estimate
    ///             .settle(|answer: &Answer| [1, answer.tokens_used]),
    ///     )
    ///     .service_fn(|_prompt: &str| async { Ok::<_, Infallible>(Answer { tokens_used: 200 }) });
    /// let start = Instant::now();
    /// complete.clone().oneshot("hello").await.unwrap();
    /// assert_eq!(llm.available(), [9, 800]); // 800 of the 1,000 came back
    /// complete.oneshot("again").await.unwrap(); // waits 2 s for the 200 it lacks
    /// assert_eq!(start.elapsed(), Duration::from_secs(2));
    /// # }
    /// ```
    pub fn settle<Resp, F>(self, settle: F) -> RateLimitLayer<Q, C, M, SettleFrom<F>>
    where
        F: Fn(&Resp) -> Q::Cost + Clone,
        SettleFrom<F>: Answered<Resp, Q::Grant>,
    {
        self.answering(SettleFrom { settle })
    }
}

impl<K, F, S, Q: KeyedLimiter, C, M: sealed::Settles> RateLimitLayer<ByKey<K, F, S, Q>, C, M> {
    /// Settles each request's charge on its key from its response, as
    /// [`settle`](RateLimitLayer::settle) does over a [`RateLimiter`]: once the inner
    /// service answers `Ok(response)`, the request's [`KeyedPermit`](crate::limiter::KeyedPermit) is
    /// settled with `settle(&response)`, on the key the request was charged to (a tenant's
    /// requests and tokens per minute, corrected from the usage its answer reports). A smaller
    /// amount gives the difference back to that key at once (the key's waiters it admits go
    /// at that instant), a larger one is charged to that key as debt; other keys are
    /// untouched. An `Err` from the inner service, or a response future dropped before the
    /// answer, keeps the charge.
    ///
    /// For a keyed layer over a several-limit [`KeyedRateLimiter`], shaping or enforcing, or
    /// over a several-limit `RedisKeyedRateLimiter` (feature `redis`, settled in Redis in the
    /// background). As over a
    /// [`RateLimiter`], an announcing layer ([`headers`](RateLimitLayer::headers)) does
    /// not settle, and the two do not combine (neither order compiles).
    ///
    /// ```compile_fail
    /// use paced::tower::{QuotaHeaders, RateLimitLayer};
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let quota = KeyedRateLimiter::<u32, [u64; 1]>::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// let _ = RateLimitLayer::keyed(&quota, |req: &http::Request<()>| 0)
    ///     .enforcing()
    ///     .settle(|_: &http::Response<()>| [1])
    ///     .headers(QuotaHeaders::Draft); // a settling layer does not announce
    /// ```
    ///
    /// ```compile_fail
    /// use paced::tower::{QuotaHeaders, RateLimitLayer};
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    ///
    /// let quota = KeyedRateLimiter::<u32, [u64; 1]>::builder(["requests"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(1), 1))
    ///     .build()
    ///     .unwrap();
    /// let _ = RateLimitLayer::keyed(&quota, |req: &http::Request<()>| 0)
    ///     .enforcing()
    ///     .headers(QuotaHeaders::Draft)
    ///     .settle(|_: &http::Response<()>| [1]); // an announcing layer does not settle
    /// ```
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use std::time::Duration;
    /// use paced::tower::RateLimitLayer;
    /// use paced::{KeyedRateLimiter, Limit, Rate};
    /// use tower::{ServiceBuilder, ServiceExt};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// struct Prompt {
    ///     tenant: &'static str,
    ///     max_tokens: u64,
    /// }
    /// struct Answer {
    ///     tokens_used: u64,
    /// }
    /// // Each tenant: 10 requests and 100 tokens per second, bursts of 10 and 1,000.
    /// let tenants = KeyedRateLimiter::builder(["requests", "tokens"])
    ///     .limit("requests", Limit::bucket(Rate::per_second(10), 10))
    ///     .limit("tokens", Limit::bucket(Rate::per_second(100), 1_000))
    ///     .build()
    ///     .unwrap();
    /// let complete = ServiceBuilder::new()
    ///     .layer(
    ///         RateLimitLayer::keyed(&tenants, |p: &Prompt| p.tenant)
    ///             .cost(|p: &Prompt| [1, p.max_tokens]) // a generous estimate
    ///             .settle(|answer: &Answer| [1, answer.tokens_used]),
    ///     )
    ///     .service_fn(|_: Prompt| async { Ok::<_, Infallible>(Answer { tokens_used: 200 }) });
    /// let start = Instant::now();
    /// let prompt = |tenant| Prompt { tenant, max_tokens: 1_000 };
    /// complete.clone().oneshot(prompt("acme")).await.unwrap();
    /// assert_eq!(tenants.available(&"acme"), [9, 800]); // 800 of the 1,000 came back
    /// assert_eq!(tenants.available(&"globex"), [10, 1_000]); // another tenant, untouched
    /// complete.oneshot(prompt("acme")).await.unwrap(); // waits 2 s for the 200 it lacks
    /// assert_eq!(start.elapsed(), Duration::from_secs(2));
    /// # }
    /// ```
    pub fn settle<Resp, G>(
        self,
        settle: G,
    ) -> RateLimitLayer<ByKey<K, F, S, Q>, C, M, SettleFrom<G>>
    where
        G: Fn(&Resp) -> Q::Cost + Clone,
        SettleFrom<G>: Answered<Resp, Q::Grant>,
    {
        self.answering(SettleFrom { settle })
    }
}

#[cfg(feature = "http")]
impl<Q, C> RateLimitLayer<Q, C, Enforcing> {
    /// Announces the quota on every response (feature `http`): the inner service's responses
    /// carry `which` headers, read from the limiter right after the decision, and a request that
    /// does not conform is answered by the layer itself, `429 Too Many Requests` with
    /// `Retry-After` (whole seconds, rounded up; none for a request that never conforms) and
    /// the same headers, instead of an error: the service's errors are the inner service's
    /// (an axum `Router` takes the layer without a `HandleErrorLayer`). The inner service
    /// must answer `http::Response<B>` with `B: Default` (the body of a `429` is empty). See
    /// [`QuotaHeaders`](super::QuotaHeaders) for how the bucket maps onto the fields.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use paced::tower::{QuotaHeaders, RateLimitLayer};
    /// use paced::{Rate, RateLimiter};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let limiter = RateLimiter::new(Rate::per_second(1), 2);
    /// let api = ServiceBuilder::new()
    ///     .layer(RateLimitLayer::new(&limiter).enforcing().headers(QuotaHeaders::XRateLimit))
    ///     .service_fn(|_req: ()| async { Ok::<_, Infallible>(http::Response::new(String::from("ok"))) });
    /// let first = api.clone().oneshot(()).await.unwrap();
    /// assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
    /// let second = api.clone().oneshot(()).await.unwrap();
    /// assert_eq!(second.headers()["x-ratelimit-remaining"], "0");
    /// assert_eq!(second.headers()["x-ratelimit-reset"], "2");
    /// let refused = api.oneshot(()).await.unwrap();
    /// assert_eq!(refused.status(), 429);
    /// assert_eq!(refused.headers()["retry-after"], "1");
    /// # }
    /// ```
    pub fn headers(self, which: super::QuotaHeaders) -> RateLimitLayer<Q, C, super::Announcing> {
        RateLimitLayer {
            limiter: self.limiter,
            cost: self.cost,
            mode: super::Announcing::new(which),
            answered: KeepCharge,
        }
    }
}

impl<S, Q: Clone, C: Clone, M: Clone, A: Clone> Layer<S> for RateLimitLayer<Q, C, M, A> {
    type Service = RateLimit<S, Q, C, M, A>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(
            inner,
            self.limiter.clone(),
            self.cost.clone(),
            self.mode.clone(),
            self.answered.clone(),
        )
    }
}

/// Shows the mode only: a limiter's own `Debug` may read its shared state, and a cost is
/// usually a closure.
impl<Q, C, M: fmt::Debug, A> fmt::Debug for RateLimitLayer<Q, C, M, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}
