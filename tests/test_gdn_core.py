"""gdnjit.gdn_core's shared cache helpers (CPU): the allocators' size checks and a layer's views."""

import pytest

from gdnjit.gdn_core import cache_layer, check_cache_sizes
from gdnjit.lazy import LazyCache, lazy_cache
from gdnjit.spec_step import SpecCache, spec_cache


@pytest.mark.parametrize("kw, match", [
    (dict(slots=0), "slots: expected a positive int, got 0"),
    (dict(K=True), "K: expected a positive int, got True"),
    (dict(H=2.0), "H: expected a positive int, got 2.0"),
    (dict(HV=-4), "HV: expected a positive int, got -4"),
    (dict(layers=0), "layers: expected None or a positive int, got 0"),
    (dict(H=3, HV=4), "HV: expected a multiple of H=3, got 4"),
])
def test_cache_sizes_are_named_in_one_line_errors(kw, match):
    args = dict(layers=None, H=2, HV=4, slots=3, K=64)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        check_cache_sizes(args.pop("layers"), args.pop("H"), args.pop("HV"), **args)
    check_cache_sizes(None, 2, 4, slots=3, K=64)  # the valid sizes pass


def test_a_layer_is_views_of_the_stacked_cache_and_a_flat_cache_has_none():
    for cache, lead in ((lazy_cache(3, 2, 4, 64, 64, layers=2), "cursor"),
                        (spec_cache(3, 2, 4, 2, 64, 64, layers=2), "ctl")):
        one = cache.layer(1)
        assert type(one) is type(cache) and isinstance(one, (LazyCache, SpecCache))
        for x, y in zip(one, cache):
            assert x.data_ptr() == y[1].data_ptr() and x.shape == y.shape[1:]
        with pytest.raises(ValueError, match=f"layer: this cache has no layer dim \\({lead} shape"):
            one.layer(0)
        assert cache_layer(cache, 0, lead)[0].shape == cache[0].shape[1:]
