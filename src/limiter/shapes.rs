//! Which state each handle keeps for `u64` and for `[u64; N]`: the one place that names the
//! handles' states by a cost's shape. Nothing imports it, so the handles depend on
//! [`Cost`](super::Cost) and not the other way round.

use super::cost::sealed::Shape;

impl Shape for u64 {
    type Local = crate::limiter::rate_limiter::One;
    type Adaptive = crate::limiter::adaptive::One;
    type Keyed<K, S> = crate::limiter::keyed::One<K, S>;
    #[cfg(feature = "redis")]
    type Redis = crate::redis::state::One;
    #[cfg(feature = "redis")]
    type RedisKeyed<K> = crate::redis::state::KeyedOne<K>;
}

impl<const N: usize> Shape for [u64; N] {
    type Local = crate::limiter::multi::Several<N>;
    type Adaptive = crate::limiter::adaptive_multi::Several<N>;
    type Keyed<K, S> = crate::limiter::keyed_multi::Several<K, N, S>;
    #[cfg(feature = "redis")]
    type Redis = crate::redis::state::Several<N>;
    #[cfg(feature = "redis")]
    type RedisKeyed<K> = crate::redis::state::KeyedSeveral<K, N>;
}
