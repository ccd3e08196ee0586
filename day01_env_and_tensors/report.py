"""Day 1's report (`results/report.md`, which the README includes): the environment and the tensor lessons' evidence,
from `report.json`."""
from sprint import markdown_table


def environment_table(env: dict) -> str:
    rows = [["Python", env["python"]], ["torch", env["torch"]], ["torchvision", env["torchvision"]],
            ["`torch.version.cuda` (the wheel's CUDA build)", env["cuda_build"]],
            ["`torch.cuda.is_available()`", env["cuda_available"]], ["device chosen", f"`{env['device']}`"],
            ["CPU", f"{env['cpu_model']}, {env['cpu_count']} cores"], ["MPS available", env["mps_available"]]]
    return markdown_table(["environment", "this machine"], rows)


def error(raised: dict, cut_at: str = "") -> str:
    """A captured exception as `Type: message`, the message cut where `cut_at` begins, when given."""
    message = raised["message"]
    if cut_at and cut_at in message:
        message = message[:message.index(cut_at)] + " ..."
    return f"`{raised['type']}: {message}`"


def layout(tensor: dict) -> str:
    return f"stride `{tuple(tensor['stride'])}`, {'contiguous' if tensor['contiguous'] else 'not contiguous'}"


def shares(flag: bool) -> str:
    return "shares storage" if flag else "**does not** share storage"


def evidence_table(lessons: dict) -> str:
    attrs, cast, views = lessons["attributes"], lessons["broadcasting"], lessons["views"]
    n = cast["trap_shape"][0]
    rows = [
        ["float32 + float64", f"`{attrs['float32_plus_float64']}`"],
        ["float32 @ float64", error(attrs["float32_matmul_float64"])],
        ["`(8,1,128) + (1,16,128)`", f"`{tuple(cast['rule_shape'])}`"],
        ["`(32,10) - (32,)`", error(cast["loud_mismatch"], cut_at=" at non-singleton")],
        [f"`(N,1) - (N,)`, N = {n}", f"shape `{tuple(cast['trap_shape'])}`; perfect model's loss "
                                      f"{cast['trap_loss']:.3f} instead of {cast['right_loss']}"],
        ["shape assert", error(cast["assert_defence"])],
        ["`a = arange(24).reshape(4,6)`", f"{layout(views['a'])}; `a.view(2,12)` and `a.reshape(2,12)` "
                                          f"{'share' if views['view_shares'] else 'do not share'} storage"],
        ["`t = a.t()`", f"{layout(views['transpose'])}, {shares(views['transpose_shares'])}"],
        ["`t.view(24)`", error(views["transpose_view"], cut_at=" (at least")],
        ["`t.reshape(24)`", f"works, {shares(views['transpose_reshape_shares'])} (a silent copy)"],
        ["`arange(24).reshape(2,3,4).permute(2,0,1)`", f"{layout(views['permute'])}, {shares(views['permute_shares'])}"],
        ["`t.contiguous()`", f"stride `{tuple(views['contiguous']['stride'])}`, new storage; `.view(24)` now "
                             f"{'works' if views['contiguous_view_works'] else 'fails'}; `a.contiguous() is a`"],
    ]
    return markdown_table(["evidence", "measured"], rows)


def report_markdown(result: dict) -> str:
    """`report.json`'s figures as the README shows them."""
    return f"{environment_table(result['environment'])}\n\n{evidence_table(result['lessons'])}\n"
