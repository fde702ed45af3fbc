"""Kubernetes ServiceAccount tokens as per-node receiver identities (TokenReview).

On Kubernetes the agent DaemonSet's pods present a projected ServiceAccount token
(audience ``autorepair-ingest``, expiry of minutes, rotated by the kubelet) as their bearer
token. :class:`TokenReviewer` asks the API server whether the token is valid for that
audience (``POST /apis/authentication.k8s.io/v1/tokenreviews``) and binds it to the node
the pod runs on:

1. ``status.user.extra["authentication.kubernetes.io/node-name"]`` when the API server
   issues node claims (Kubernetes ≥ 1.30, ``ServiceAccountTokenPodNodeInfo``);
2. else the pod of ``…/pod-name`` + ``…/pod-uid`` (every bound token carries them): its
   ``spec.nodeName``, read once (``GET /api/v1/namespaces/NS/pods/NAME``, uid checked)
   and cached — a pod never moves to another node.

A token of another service account than ``ingest.service_account_tokens.
service_accounts``, for another audience, or naming no pod is refused: a token that
names no pod could have been minted by anyone allowed to create tokens for the account,
and says nothing about a node. A node cannot lend its token to another: the token names
its own pod, the pod its own node. Verified identities are kept ``cache_s`` (never past
the token's ``exp``), refusals ``failure_cache_s``; at most ``max_concurrent_reviews``
calls are in flight (more: refused without asking), so made-up tokens cannot flood the
API server. The token itself is never logged or kept (only its SHA-256).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from ingest.auth import ROLE_NODE, Identity
from workflows.config import ServiceAccountTokensConfig

log = logging.getLogger("autorepair.ingest.kube_tokens")

NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"
POD_UID_CLAIM = "authentication.kubernetes.io/pod-uid"
SA_PREFIX = "system:serviceaccount:"
JWT_SHAPE = re.compile(rb"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
"""Three base64url segments: a JWS compact serialization (what the API server issues)."""
MAX_TOKEN_BYTES = 16 * 1024
"""Longer bearer tokens are not sent for review (ServiceAccount JWTs are ~1 KB)."""


def _unverified_exp(token: bytes) -> float | None:
    """The ``exp`` claim (seconds since the epoch) of a JWT, unverified — only used to
    keep a cached identity no longer than the token lives; ``None`` when absent."""
    try:
        seg = token.split(b".")[1]
        claims = json.loads(base64.urlsafe_b64decode(seg + b"=" * (-len(seg) % 4)))
        exp = claims.get("exp") if isinstance(claims, dict) else None
        return float(exp) if isinstance(exp, int | float) else None
    except (ValueError, IndexError, TypeError):
        return None


class TokenReviewer:
    """Verifies ServiceAccount tokens and maps them to node identities (module docstring).

    ``api_client``: a ``kubernetes_asyncio`` ``ApiClient`` (``None``: built on first use
    from ``cfg.kubeconfig`` or the in-cluster config, and closed by :meth:`close`).
    ``cluster``: the cluster id the nodes belong to. ``clock``: monotonic seconds;
    ``wall``: seconds since the epoch (the tokens' ``exp``); both for tests.
    """

    def __init__(self, cfg: ServiceAccountTokensConfig, cluster: str | None, *,
                 api_client: k8s.ApiClient | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.accounts = frozenset(SA_PREFIX + sa.replace("/", ":") for sa in
                                  cfg.service_accounts)
        self._client = api_client
        self._own_client = api_client is None
        self.clock = clock
        self.wall = wall
        #: verified identities and refusals apart, each bounded by ``max_cached_tokens``:
        #: a flood of made-up tokens evicts only other refusals, never a node's identity
        self._cache: OrderedDict[bytes, tuple[float, Identity | None]] = OrderedDict()
        self._refused: OrderedDict[bytes, tuple[float, Identity | None]] = OrderedDict()
        self._pods: OrderedDict[tuple[str, str, str], str] = OrderedDict()
        self._inflight = 0
        self.reviews = 0
        """TokenReview calls made (tests and metrics read it)."""
        self.pod_reads = 0
        """Pod reads made (a pod is read once, whatever its token rotations)."""

    @classmethod
    def from_config(cls, cfg: ServiceAccountTokensConfig, clusters: Sequence[str]
                    ) -> TokenReviewer:
        """The reviewer of ``ingest.service_account_tokens`` given the configured cluster
        names. Raises ``ValueError`` naming ``ingest.service_account_tokens.cluster`` when
        it is unset with several clusters configured, or names none of them."""
        cluster = cfg.cluster
        if cluster is None:
            if len(clusters) > 1:
                raise ValueError("ingest.service_account_tokens.cluster: required when "
                                 f"several clusters are configured ({', '.join(clusters)})")
            cluster = clusters[0] if clusters else None
        elif clusters and cluster not in clusters:
            raise ValueError(f"ingest.service_account_tokens.cluster: {cluster!r} is not a "
                             f"configured cluster ({', '.join(clusters)})")
        return cls(cfg, cluster)

    async def _api(self) -> k8s.ApiClient:
        if self._client is None:
            conf = k8s.Configuration()
            if self.cfg.kubeconfig:
                await k8s_config.load_kube_config(config_file=self.cfg.kubeconfig,
                                                  client_configuration=conf)
            else:
                k8s_config.load_incluster_config(client_configuration=conf)
            self._client = k8s.ApiClient(conf)
        return self._client

    async def close(self) -> None:
        """Close the API client when this reviewer built it."""
        if self._own_client and self._client is not None:
            await self._client.close()
            self._client = None

    def _remember(self, key: bytes, ident: Identity | None, token: bytes) -> None:
        now = self.clock()
        if ident is None:
            until = now + self.cfg.failure_cache_s
        else:
            until = now + self.cfg.cache_s
            exp = _unverified_exp(token)
            if exp is not None:
                until = min(until, now + (exp - self.wall()))
        cache = self._refused if ident is None else self._cache
        cache[key] = (until, ident)
        cache.move_to_end(key)
        while len(cache) > self.cfg.max_cached_tokens:
            cache.popitem(last=False)

    async def identify(self, token: bytes) -> Identity | None:
        """The node identity of ServiceAccount ``token``, or ``None`` (not a token this
        reviewer accepts, refused by the API server, or the API server unreachable)."""
        if len(token) > MAX_TOKEN_BYTES or not JWT_SHAPE.fullmatch(token):
            return None
        key = hashlib.sha256(token).digest()
        for cache in (self._cache, self._refused):
            hit = cache.get(key)
            if hit is not None:
                if hit[0] > self.clock():
                    return hit[1]
                del cache[key]
        if self._inflight >= self.cfg.max_concurrent_reviews:
            log.warning("event=token_review_busy in_flight=%d", self._inflight)
            return None
        self._inflight += 1
        try:
            ident = await asyncio.wait_for(self._review(token), self.cfg.timeout_s)
        except (TimeoutError, k8s.ApiException, OSError, ValueError) as exc:
            # not cached: the API server may be back for the agent's next push
            log.warning("event=token_review_failed error=%s", type(exc).__name__)
            return None
        finally:
            self._inflight -= 1
        self._remember(key, ident, token)
        return ident

    async def _review(self, token: bytes) -> Identity | None:
        api = await self._api()
        self.reviews += 1
        body = k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(
            token=token.decode("ascii"), audiences=[self.cfg.audience]))
        review = await k8s.AuthenticationV1Api(api).create_token_review(body)
        st = review.status
        if st is None or not st.authenticated or st.user is None:
            log.info("event=token_review_refused reason=not_authenticated")
            return None
        if st.audiences is not None and self.cfg.audience not in st.audiences:
            log.info("event=token_review_refused reason=audience")
            return None
        user = st.user.username or ""
        if user not in self.accounts:
            log.info("event=token_review_refused reason=service_account user=%r", user)
            return None
        extra: dict[str, Any] = st.user.extra or {}
        namespace = user[len(SA_PREFIX):].split(":", 1)[0]
        pod_name = _one(extra.get(POD_NAME_CLAIM))
        pod_uid = _one(extra.get(POD_UID_CLAIM))
        node = _one(extra.get(NODE_NAME_CLAIM))
        if node is None and pod_name and pod_uid:
            node = await self._pod_node(api, namespace, pod_name, pod_uid)
        if not node:
            log.info("event=token_review_refused reason=no_pod user=%r", user)
            return None
        where = f"{self.cluster}/{node}" if self.cluster else node
        return Identity(ROLE_NODE, f"node {where} (service account token, pod "
                                   f"{namespace}/{pod_name})", self.cluster, node)

    async def _pod_node(self, api: k8s.ApiClient, namespace: str, name: str, uid: str
                        ) -> str | None:
        key = (namespace, name, uid)
        node = self._pods.get(key)
        if node is not None:
            return node
        self.pod_reads += 1
        try:
            pod = await k8s.CoreV1Api(api).read_namespaced_pod(name, namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:  # the pod is gone: its token no longer names a node
                return None
            raise
        if pod.metadata is None or pod.metadata.uid != uid or pod.spec is None:
            return None  # a new pod under the old name: the token is the old pod's
        node = pod.spec.node_name
        if node:
            self._pods[key] = node
            while len(self._pods) > self.cfg.max_cached_tokens:
                self._pods.popitem(last=False)
        return node


def _one(values: Any) -> str | None:
    """The single value of a ``user.extra`` claim (a list of strings), else ``None``."""
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0] or None
    return None
