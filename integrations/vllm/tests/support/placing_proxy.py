"""The host that places sessions itself, as the seed's in-process proxy
would: one `openai` client per `vllm serve` replica, `kvgate.Placement` over
the replicas' /metrics (`kvgate_vllm.placement.MetricsRooms`), and a turn
that maps a replica's HTTP 429 to `kvgate.Refused` and a replica it cannot
reach to `kvgate.Unreachable`, so the placement puts the session elsewhere
(the same rule as new sessions; later turns stay there). Each completion's
output tokens (its `usage`) teach the placement what a running turn will
still write. Used by the placement tests and the scale-out benchmark."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import kvgate
import openai

from kvgate_vllm.placement import MetricsRooms, refused_of

from support.openai_sessions import client_turn


def output_tokens(completion: Any) -> Optional[int]:
    """A completion's output tokens, from its `usage` (None if absent)."""
    usage = getattr(completion, "usage", None)
    return getattr(usage, "completion_tokens", None)


class PlacingProxy:
    def __init__(
        self, urls: Sequence[str], model: str, max_age_sec: float = 1.0, timeout_sec: float = 3600.0, metrics_timeout_sec: float = 2.0
    ) -> None:
        """`max_age_sec`, `metrics_timeout_sec`: MetricsRooms'; `timeout_sec`: each turn's."""
        self.clients = {
            url: openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=timeout_sec) for url in urls
        }
        self._turns = {url: client_turn(client, model) for url, client in self.clients.items()}
        self.rooms = MetricsRooms(list(urls), max_age_sec=max_age_sec, timeout_sec=metrics_timeout_sec)
        self.placement = kvgate.Placement(list(urls), rooms=self.rooms, output_tokens=output_tokens)

    async def send(self, url: str, session: str, prompt: list, n: int, final: bool = False) -> Any:
        """One turn to `url`, bypassing the placement; a 429 raises
        `kvgate.Refused`, a connection that fails `kvgate.Unreachable`."""
        try:
            return await self._turns[url](session, prompt, n, final)
        except openai.RateLimitError as e:
            raise refused_of(e.status_code, e.response.headers) from e
        except openai.APITimeoutError:
            raise  # reached, but slow: not a vanished replica
        except openai.APIConnectionError as e:
            raise kvgate.Unreachable(url, e) from e

    async def turn(self, session: str, prompt: list, n: int, final: bool = False) -> Any:
        """One turn where the placement puts the session; the last one (`final`) frees its place."""
        out = await self.placement.turn(session, len(prompt), lambda url: self.send(url, session, prompt, n, final))
        if final:
            self.placement.finish(session)
        return out

    async def close(self) -> None:
        await self.rooms.close()
        for client in self.clients.values():
            await client.close()
