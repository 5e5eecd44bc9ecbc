"""Engine core: vLLM's limits over its whole running list, kept for a plan's admissions.

The plug-in shows vLLM only the running requests a plan runs (`plugin._schedule_plan`),
so a limit vLLM counts over its running list would see only those. vLLM 0.33 counts the
LoRA adapter of every running request against `max_loras`, scheduled this step or not
(0.32: only those scheduled): a request held for a step keeps its adapter's slot, so an
admission of another adapter waits. The other limits are the policy's own: seats count
`max_num_active_seqs` (`EngineLimits.max_num_seqs`), and the watermark is kept whenever
any request runs (`admission.StepAdmission`).
"""

from __future__ import annotations


def within_max_loras(chosen: list, running: list, lora_config) -> list:
    """`chosen` (a plan's admissions, in its order) less those whose adapter would take
    a slot past `max_loras` beside every running request's; the rest stay waiting."""
    if lora_config is None:
        return chosen
    slots = {lora_id(request) for request in running} - {0}
    kept = []
    for request in chosen:
        adapter = lora_id(request)
        if adapter and adapter not in slots:
            if len(slots) >= lora_config.max_loras:
                continue
            slots.add(adapter)
        kept.append(request)
    return kept


def lora_id(request) -> int:
    """The request's adapter id (0: none; vLLM counts only ids above 0)."""
    lora = request.lora_request
    return max(lora.lora_int_id, 0) if lora else 0
