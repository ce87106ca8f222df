import os

# As Lightning's fabric package does when it is imported.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
