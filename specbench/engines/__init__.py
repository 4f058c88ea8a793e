"""The engines that decode a run's questions: ``base.Engine`` is the seam, ``specbench_loop`` and ``vllm`` the two
engines; ``load_engine`` picks the one ``engine=`` names."""

from __future__ import annotations


def load_engine(engine_node, model_node, drafter_node, settings, processes):
    """The engine ``engine.name`` names, loaded for the run's model and drafter (vLLM is imported only for
    ``engine=vllm``)."""
    name = engine_node.name if engine_node is not None else "specbench"
    if name == "vllm":
        from specbench.engines.vllm import VllmEngine

        return VllmEngine.load(engine_node, model_node, drafter_node, settings, processes)
    from specbench.engines.specbench_loop import SpecbenchLoop

    return SpecbenchLoop.load(model_node, drafter_node, settings, processes)
