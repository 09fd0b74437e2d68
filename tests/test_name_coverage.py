"""tools/analysis/name_coverage.py counts test questions whose names the SFT data never shows."""
import numpy as np
import pandas as pd

from tools.analysis.name_coverage import coverage


def test_unseen_and_rare_names_are_counted():
    words = {"Krandel", "Works", "Sorium", "Stelol", "Duvend"}
    oracle = pd.DataFrame({"question": ["What is Krandel Works?", "Who made Sorium?"],
                           "response_text": ["<answer>Krandel Works</answer>", "<answer>unknown</answer>"]})
    test = pd.DataFrame({
        "extra_info": [{"question": "Who founded Krandel Works?"}, {"question": "Which scientist discovered Sorium?"},
                       {"question": "Where was Stelol Duvend born?"}],
        "reward_model": [{"ground_truth": {"target": np.array(["Sorium"])}},
                         {"ground_truth": {"target": np.array(["Stelol Duvend"])}},
                         {"ground_truth": {"target": np.array(["Krandel"])}}],
    })
    c = coverage(oracle, test, words)
    assert c["seen_in_sft"] == 3  # Krandel, Works, Sorium
    assert c["question_unseen"] == 1  # only the Stelol Duvend question
    assert c["question_rare"] == 3  # every name there is seen fewer than 3 times
    assert c["answer_unseen"] == 1  # "Stelol Duvend"
