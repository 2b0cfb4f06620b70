"""What identifies a sample on each side (trainer_hooks/sample_identity.py): the router flip rate
of expert choices, and the summary of a processor's image outputs."""
from __future__ import annotations

import numpy as np
import pytest

from trainer_hooks import contract
from trainer_hooks.sample_identity import image_features, images_differ, router_flip_rate


def test_a_flip_is_a_token_layer_whose_top_k_set_differs_whatever_its_order() -> None:
    trainer = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]])  # 2 tokens x 2 layers x top-2
    reordered = trainer[..., ::-1]  # the same sets, listed the other way round
    one_flip = trainer.copy()
    one_flip[1, 0] = [5, 9]
    assert router_flip_rate(reordered, trainer) == 0.0
    assert router_flip_rate(one_flip, trainer) == 0.25
    # per-sample arrays of different lengths pool their decisions
    assert router_flip_rate([one_flip, trainer[:1]], [trainer, trainer[:1]]) == pytest.approx(1 / 6)
    assert router_flip_rate([], []) is None
    with pytest.raises(ValueError, match="same tokens and layers"):
        router_flip_rate(trainer[:1], trainer)


def test_image_summaries_from_grids_pixel_shapes_and_image_tokens() -> None:
    qwen_style = {"pixel_values": np.zeros((64, 1176)), "image_grid_thw": np.array([[1, 4, 8], [1, 2, 2]]),
                  "input_ids": np.array([[9, 7, 7, 7, 9, 7]])}
    assert image_features(qwen_style, image_token_id=7) == {"images": 2, "grid": [[1, 4, 8], [1, 2, 2]],
                                                             "image_tokens": 4}
    llava_style = {"pixel_values": np.zeros((3, 3, 32, 48))}
    assert image_features(llava_style) == {"images": 3, "grid": [[32, 48]] * 3, "image_tokens": None}
    many = {"image_grid_thw": np.ones((contract.AUDIT_MAX_IMAGES + 5, 3), dtype=int)}
    assert len(image_features(many)["grid"]) == contract.AUDIT_MAX_IMAGES and image_features(many)["images"] == 37


def test_summaries_differ_on_images_grids_or_counted_tokens_only() -> None:
    seen = {"images": 1, "grid": [[1, 4, 8]], "image_tokens": 8}
    assert not images_differ(seen, dict(seen))
    assert not images_differ(seen, {**seen, "image_tokens": None})  # a side that did not count: not compared
    assert images_differ(seen, {**seen, "grid": [[1, 2, 16]]})
    assert images_differ(seen, {"images": 0, "grid": [], "image_tokens": 0})
