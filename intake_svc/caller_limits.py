"""Per-caller admission at the intake, before the global and per-device limits: tenants cannot hurt each other.

For each Submit / SubmitBatch, in this order (each refusal is per task, and changes nothing for it):

1. **Priorities**: HIGH and CRITICAL are entitlements (`SIEVE_CALLER_POLICIES` ... `priorities=HIGH|CRITICAL`);
   a task using one its caller lacks is refused PERMISSION_DENIED naming `<field>.priority`.
2. **Submit rate**: a token bucket per caller in Redis (`takeTokens` script: one token per task, refilled at
   `rate_per_s` up to `burst`, shared by every intake replica). The first tasks of a batch get the tokens there
   are; the others are refused RESOURCE_EXHAUSTED with a RetryInfo of when enough tokens are back.
3. **Device ownership** (`ownership.py`): a task for a device another caller owns is refused PERMISSION_DENIED
   naming the device (never its owner).
4. **Pending quota**: the caller's open tasks (queued, leased or delayed: accepted and not final) are counted in
   Redis by the same scripts that move tasks (`Keys.caller_open`); the enqueue refuses a caller over its quota
   atomically (RESOURCE_EXHAUSTED with RetryInfo). The default quota is a fraction of the global limit, so no
   single caller can fill the global limit alone.

Operators (and the anonymous principal, which holds every role) use every priority, submit for any device
without claiming it, and have no rate or quota of their own unless `SIEVE_CALLER_POLICIES` names them.
"""

from __future__ import annotations

from google.rpc import code_pb2, error_details_pb2, status_pb2

from intake_svc.admission import RetryAdvisor, global_retry_after_s
from sieve.caller_policy import CallerPolicies, CallerPolicy
from sieve.redis.queue_store import NO_LIMIT, QueueStore, TokenTake
from sieve.rpc.auth import Principal
from sieve.settings import Settings

#: ErrorInfo domain of the refusals made here
DOMAIN = "sieve.v1.IntakeService"


def permission_denied(message: str, reason: str, **metadata: str) -> status_pb2.Status:
    """PERMISSION_DENIED with an ErrorInfo (reason, metadata such as the field or the device)."""
    status = status_pb2.Status(code=code_pb2.PERMISSION_DENIED, message=message)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata))
    return status


class CallerLimits:
    """Each caller's policy, its submit token bucket and its pending quota (the quota itself is enforced by the
    enqueue script; this class says which limit applies and how long a refused caller should wait)."""

    def __init__(self, queues: QueueStore, settings: Settings, retry: RetryAdvisor) -> None:
        self.queues = queues
        self.settings = settings
        self.policies = CallerPolicies(settings)
        self.retry = retry

    def policy_of(self, principal: Principal) -> CallerPolicy:
        return self.policies.policy(principal.name, operator=principal.is_operator)

    @staticmethod
    def quota(policy: CallerPolicy) -> int:
        """The open-task limit handed to the enqueue script (NO_LIMIT when the caller has none)."""
        return NO_LIMIT if policy.max_pending is None else policy.max_pending

    @staticmethod
    def claims_devices(principal: Principal) -> bool:
        """Whether ownership applies to this caller: every client, and the anonymous principal as one tenant."""
        return principal.anonymous or not principal.is_operator

    @staticmethod
    def token_take(caller: str, policy: CallerPolicy, wanted: int) -> TokenTake | None:
        """The submit tokens `wanted` tasks cost this caller (None: no rate limit applies)."""
        if policy.rate_per_s is None or wanted == 0:
            return None
        return TokenTake(caller, wanted, policy.rate_per_s, policy.burst)

    async def quota_retry_after_s(self, open_tasks: int, incoming: int, policy: CallerPolicy) -> float:
        """When a caller over its quota should come back: reckoned like a global refusal (admission.py) with the
        caller's quota as the limit, i.e. the time its excess takes at the measured drain rate (its own tasks
        drain no faster than that), jittered, at most retry_after_s."""
        limit = policy.max_pending if policy.max_pending is not None else self.settings.max_total_pending
        return global_retry_after_s(
            open_tasks, incoming, await self.retry.drain(), self.settings.replace(max_total_pending=limit)
        )


__all__ = ["CallerLimits", "permission_denied"]
