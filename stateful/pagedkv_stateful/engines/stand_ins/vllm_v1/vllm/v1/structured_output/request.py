"""Stand-in: vllm.v1.structured_output.request.StructuredOutputRequest."""


class StructuredOutputRequest:
    @staticmethod
    def from_sampling_params(sampling_params):
        # vLLM makes none for a request without structured-output constraints.
        if sampling_params is None or not sampling_params.structured_outputs:
            return None
        raise NotImplementedError("structured outputs are not part of the stand-in")
