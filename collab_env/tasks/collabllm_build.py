"""Former home of the MR-ranked dataset builder, now :mod:`collab_env.data.collabllm_build`
(it plays episodes and scores them with the multiturn-aware reward, so it sits above
``rollout`` and ``rewards``). This path keeps working."""

from collab_env.data.collabllm_build import abuild_multiturn_dataset, build_multiturn_dataset

__all__ = ["abuild_multiturn_dataset", "build_multiturn_dataset"]
