"""Router: the entry gateway. Normalizes a question, describes it, and binds it to a channel.

route() is the whole policy. Placement is work-conserving: within the question's channel
group (category × length tier) the strategy's pick takes it if that channel is idle, else
the next idle channel of the group does (in strict a channel carries nothing from one
question to the next, so waiting for a busy one buys nothing). Only when every channel of
the group is busy may it wait in a channel's own queue (router.channel_queue_depth > 0):
the breaker's redirect, then the pick, then the least-loaded channel with room. None means
no channel of the group can take it, and the caller applies router.overflow_policy.
"""
from __future__ import annotations

from dataclasses import dataclass

from kev.config.schema import RouterConfig
from kev.router.breaker import Breaker
from kev.router.categories import CategoryMatcher
from kev.router.consistent_hash import ConsistentHash
from kev.router.features import PoolView, QuestionFeatures, Strategy, least_loaded, next_idle
from kev.router.layout import ChannelGroup, ChannelLayout
from kev.router.length_aware import LengthAware, tier_of
from kev.router.normalize import Normalizer
from kev.router.round_robin import RoundRobin
from kev.router.semantic import Encoder, SemanticHash, SimHasher


@dataclass(frozen=True)
class Placement:
    channel_id: int
    rerouted: bool  # moved off the strategy's pick (to an idle channel, by the breaker, or off a full queue)


def make_strategy(config: RouterConfig) -> Strategy:
    if config.strategy == "semantic_hash":
        return SemanticHash()
    if config.strategy == "consistent_hash":
        return ConsistentHash(config.virtual_nodes, config.epsilon)
    if config.strategy == "length_aware":
        return LengthAware()
    return RoundRobin()


class Router:
    def __init__(self, config: RouterConfig, encoder: Encoder | None = None) -> None:
        self.normalizer = Normalizer(config.filler_words, config.greetings, config.normalize)
        self.hasher = SimHasher(config.num_buckets, config.hash_seed, encoder)
        self.categories = CategoryMatcher(config.categories)
        self.tiers = config.length_tiers if config.strategy == "length_aware" else ()
        self.layout = ChannelLayout(config.channel_pool_size, config.max_parallel_queries,
                                    self.categories.names, len(self.tiers) + 1)
        self.strategy = make_strategy(config)
        self.breaker = Breaker(config.breaker_threshold)

    @property
    def strategy_name(self) -> str:
        return self.strategy.name

    def describe(self, text: str, num_tokens: int) -> QuestionFeatures:
        """Features of a question from its (normalized) text and its prompt length."""
        return QuestionFeatures(num_tokens, self.hasher.bucket(text), self.categories.match(text))

    def group_for(self, features: QuestionFeatures) -> ChannelGroup:
        return self.layout.group(features.category, tier_of(features.num_tokens, self.tiers))

    def route(self, features: QuestionFeatures, view: PoolView) -> Placement | None:
        channels = self.group_for(features).channels
        chosen = self.strategy.choose(features, channels, view)
        idle = next_idle(channels, chosen, view)
        if idle is not None:
            return Placement(idle, rerouted=idle != chosen)
        target = self.breaker.redirect(chosen, channels, view)
        if not view.can_take(target):
            open_channels = [c for c in channels if view.can_take(c)]
            if not open_channels:
                return None
            target = least_loaded(open_channels, view)
        return Placement(target, rerouted=target != chosen)
