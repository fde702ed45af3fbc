"""``autorepair domains status|release --cluster C`` with a cluster the config does not
list is an error naming it, as ``breaker status`` and ``repairs create`` are.

``domains status --cluster typo`` printed an empty table ("no guard runs for this cluster
yet: nothing is held", exit 0), and ``domains release --cluster typo rack-1`` answered
"domain 'rack-1' is not held on cluster 'typo'": an operator reads "nothing held" for a
cluster whose repairs may all be held.
"""

from __future__ import annotations

from tests.detectors.conftest import Stack
from tests.detectors.test_cli import api_url, cli, flat  # noqa: F401  (fixture)


async def test_domains_commands_refuse_an_unknown_cluster(stack: Stack, api_url: str) -> None:  # noqa: F811
    for args in (("domains", "status", "--cluster", "typo"),
                 ("domains", "release", "rack-1", "--cluster", "typo")):
        r = await cli(*args, "--api", api_url)
        out = flat(r.output)
        assert r.exit_code == 1, out
        assert "unknown cluster 'typo'" in out and stack.cluster in out, out
    # the configured cluster still answers (no guard yet: nothing held)
    r = await cli("domains", "status", "--cluster", stack.cluster, "--api", api_url, "--json")
    assert r.exit_code == 0, r.output
