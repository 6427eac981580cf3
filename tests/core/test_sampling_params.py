import pytest

from core.sampling import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_invalid_values_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation() -> None:
    p = SamplingParams(stop="###", stop_token_ids=[3])
    assert p.stop == ("###",) and p.stop_token_ids == (3,)
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams().is_greedy
