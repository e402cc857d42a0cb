"""Reading VERL and TRL rows from JSONL and Parquet; bad rows name file, row and field."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhfless.config import ModelConfig
from rlhfless.data import DataConfig, DataError, check_prompt_tokens, load_prompts
from rlhfless.inputs import InputError

SYSTEM = "Answer in <answer></answer>."


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load(path, fmt="auto", system_prompt=SYSTEM):
    return load_prompts(DataConfig(source="file", path=str(path), format=fmt, system_prompt=system_prompt))


VERL_ROWS = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "What is 2+2?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": "What is 3*3?",
        "reward_model": {"style": "rule", "ground_truth": 9},
        "extra_info": {"split": "train", "index": 1},
    },
]


def test_verl_jsonl_rows_become_chat_prompts_with_system_prompt(tmp_path):
    prompts = load(write_jsonl(tmp_path / "gsm.jsonl", VERL_ROWS))
    assert [p.ground_truth for p in prompts] == ["4", "9"]
    assert prompts[0].data_source == "openai/gsm8k"
    assert prompts[0].extra_info == {"split": "train", "index": 0}
    assert prompts[1].messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is 3*3?"},
    ]


def test_verl_parquet_reads_like_jsonl(tmp_path):
    path = tmp_path / "gsm.parquet"
    rows = [
        {**VERL_ROWS[0], "prompt": [{"role": "user", "content": "hi"}]},
        {
            **VERL_ROWS[0],
            "prompt": [{"role": "user", "content": "ho"}],
            "reward_model": {"ground_truth": "9"},
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    prompts = load(path)
    assert [p.ground_truth for p in prompts] == ["4", "9"]
    assert prompts[0].messages == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    assert prompts[1].extra_info == {"split": "train", "index": 0}
    assert prompts[0].uid != prompts[1].uid


def test_existing_system_message_is_kept(tmp_path):
    row = {"prompt": [{"role": "system", "content": "Own."}, {"role": "user", "content": "Q"}]}
    (prompt,) = load(write_jsonl(tmp_path / "t.jsonl", [row]))
    assert prompt.messages[0] == {"role": "system", "content": "Own."}
    assert len(prompt.messages) == 2


def test_trl_plain_and_conversational_prompts_with_solution_column(tmp_path):
    rows = [
        {"prompt": "Name a colour.", "solution": "red", "level": 1},
        {"prompt": [{"role": "user", "content": "2+5?"}], "solution": "7", "level": 2},
    ]
    prompts = load(write_jsonl(tmp_path / "trl.jsonl", rows), system_prompt="")
    assert prompts[0].messages == [{"role": "user", "content": "Name a colour."}]
    assert [p.ground_truth for p in prompts] == ["red", "7"]
    assert prompts[1].extra_info == {"solution": "7", "level": 2}  # every column, as TRL passes them
    assert [p.chat for p in prompts] == [False, True]
    assert prompts[0].data_source == "trl"


def test_trl_without_answer_column_has_no_ground_truth(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "Write a haiku."}]), path)
    (prompt,) = load(path, fmt="trl")
    assert prompt.ground_truth is None


def test_uid_is_stable_across_loads_and_distinct_per_row(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", VERL_ROWS + VERL_ROWS[:1])
    first, second = load(path), load(path)
    assert [p.uid for p in first] == [p.uid for p in second]
    assert len({p.uid for p in first}) == 3


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"reward_model": {"ground_truth": "1"}}, "'prompt': missing"),
        ({"prompt": 5, "reward_model": {"ground_truth": "1"}}, "'prompt': got int"),
        (
            {"prompt": [{"role": "bot", "content": "x"}], "reward_model": {"ground_truth": "1"}},
            "'prompt[0].role'",
        ),
        ({"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}, "'prompt[0].content'"),
        ({"prompt": "q"}, "'reward_model': missing"),
        ({"prompt": "q", "reward_model": {"style": "rule"}}, "'reward_model.ground_truth': missing"),
        ({"prompt": "q", "reward_model": {"ground_truth": ["1"]}}, "'reward_model.ground_truth': got list"),
        ({"prompt": "q", "reward_model": {"ground_truth": "1"}, "extra_info": [1]}, "'extra_info': got list"),
    ],
)
def test_bad_verl_row_names_file_row_and_field(tmp_path, row, field):
    path = write_jsonl(tmp_path / "bad.jsonl", [VERL_ROWS[0], VERL_ROWS[1], row])
    with pytest.raises(DataError) as err:
        load(path, fmt="verl")
    message = str(err.value)
    assert str(path) in message and "row 3" in message and field in message and "expected" in message


def test_bad_parquet_row_number_is_one_based(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"prompt": "a", "solution": "1"}, {"prompt": None, "solution": "2"}]), path
    )
    with pytest.raises(DataError, match=r"bad\.parquet: row 2: field 'prompt'"):
        load(path)


def test_invalid_json_line_is_reported_by_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl: row 3: invalid JSON"):
        load(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"nowhere\.jsonl: data file not found"):
        load(tmp_path / "nowhere.jsonl")


def test_a_directory_is_named_with_how_to_make_a_file_of_it(tmp_path):
    """A `datasets` folder (save_to_disk) is not a missing file."""
    with pytest.raises(DataError, match=r"is a directory, expected a \.jsonl, \.json or \.parquet file"):
        load(tmp_path)


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match="no rows"):
        load(write_jsonl(tmp_path / "empty.jsonl", []))


def test_a_prompt_that_with_its_new_tokens_overruns_the_model_s_positions_is_named(tmp_path):
    from rlhfless.models import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(path="tiny"))
    rows = [{"prompt": "hi", "solution": "1"}, {"prompt": "x" * 100, "solution": "2"}]
    prompts = load(write_jsonl(tmp_path / "trl.jsonl", rows), system_prompt="")
    check_prompt_tokens(prompts, tokenizer, 1024, positions=200, new_tokens=16)  # none past 200
    with pytest.raises(DataError, match=r"row 2: field 'prompt': \d+ tokens .*max_new_tokens=100 .*=200"):
        check_prompt_tokens(prompts, tokenizer, 1024, positions=200, new_tokens=100)


def test_a_json_array_file_loads_as_its_jsonl_does(tmp_path):
    """`json.dump(rows)` writes an array, as HF `datasets` reads a `.json` file either way."""
    array = tmp_path / "gsm.json"
    array.write_text(json.dumps(VERL_ROWS, indent=1))
    assert load(array) == load(write_jsonl(tmp_path / "gsm.jsonl", VERL_ROWS))
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(VERL_ROWS, indent=1)[:-40])
    with pytest.raises(
        InputError, match=r"cut.json: line \d+: invalid JSON .*expected a JSON array of prompt rows"
    ):
        load(cut)


def test_a_list_of_files_reads_each_in_order_as_verl_s_train_files(tmp_path):
    """VERL's data.train_files is a list; each file keeps its own layout and names its own rows."""
    verl = write_jsonl(tmp_path / "gsm.jsonl", VERL_ROWS)
    trl = write_jsonl(tmp_path / "extra.jsonl", [{"prompt": "What is 5+5?", "solution": "10"}])
    prompts = load_prompts(DataConfig(source="file", path=[str(verl), str(trl)], system_prompt=SYSTEM))
    assert [p.ground_truth for p in prompts] == ["4", "9", "10"]
    assert [p.data_source for p in prompts] == ["openai/gsm8k", "openai/gsm8k", "extra"]
    assert prompts[-1].origin == f"{trl}: row 1"
    broken = write_jsonl(tmp_path / "broken.jsonl", [{"no_prompt": 1}])
    with pytest.raises(DataError, match=f"^{broken}: row 1"):
        load_prompts(DataConfig(source="file", path=[str(verl), str(broken)]))
