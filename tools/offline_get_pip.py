"""Stand-in for the get-pip.py that ansible-test downloads when it bootstraps a venv.

ansible-test fetches get-pip.py from the internet on first use (ansible/ansible#77304),
which fails on machines that reach only a package index. It looks for a cached copy first,
so `tools/prepare_ansible_test.py` installs this file there. It does what get-pip does
with the tools the interpreter already has: ensurepip for a first pip, then pip itself to
install the pinned versions ansible-test asks for, from the index in pip's own config.
"""
import subprocess
import sys

# get-pip.py options that pip itself does not know.
GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main():
    args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY]
    subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
    subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)


if __name__ == "__main__":
    main()
