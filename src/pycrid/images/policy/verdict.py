"""What a policy said of an image, and whether it will look at signatures: the parts of
evaluation the daemon needs before any signature is read, kept apart from the
cryptography (``evaluate``), which is imported only when a signature is checked."""

from __future__ import annotations

from dataclasses import dataclass

from pycrid.images.policy.config import BASE_LAYER, INSECURE, REJECT, Policy
from pycrid.images.policy.names import Named


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    policy: str
    #: The scope of ``transports.docker`` that applied; None for ``default``.
    scope: str | None
    #: Why it was refused (empty when allowed).
    reason: str = ""

    @property
    def scope_text(self) -> str:
        return "default" if self.scope is None else f'transports.docker["{self.scope}"]'


def needs_signatures(policy: Policy, ref: Named) -> bool:
    """Whether any requirement of ``ref``'s scope looks at signatures."""
    return any(r.type not in (INSECURE, REJECT, BASE_LAYER)
               for r in policy.requirements_for(ref)[1])
