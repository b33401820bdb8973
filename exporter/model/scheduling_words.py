"""What the cluster autoscaler's events about a pod say, in a word (pure)."""

from __future__ import annotations

from exporter.model.pending import ScaleUp

SCALE_UP_FAILURES = ("out_of_resources", "quota_exceeded", "other")


def scale_up_word(reason: str, message: str) -> ScaleUp | None:
    """``TriggeredScaleUp``: triggered; ``FailedScaleUp``: failed; ``NotTriggerScaleUp``:
    failed while its groups back off after a failed scale-up, max_size when a group it fits
    is at its maximum, else no_group."""
    if reason == "TriggeredScaleUp":
        return "triggered"
    if reason == "FailedScaleUp":
        return "failed"
    if reason == "NotTriggerScaleUp":
        if "backoff after failed scale-up" in message:
            return "failed"
        if "max node group size reached" in message or "max cluster" in message:
            return "max_size"
        return "no_group"
    return None


def scale_up_failure(message: str) -> str:
    """Why GKE's ``FailedScaleUp`` says the scale-up failed (``SCALE_UP_FAILURES``)."""
    text = message.lower()
    if "out of resources" in text or "resource_pool_exhausted" in text or \
            "zone_resource_pool_exhausted" in text:
        return "out_of_resources"
    if "quota exceeded" in text or "quota_exceeded" in text:
        return "quota_exceeded"
    return "other"
