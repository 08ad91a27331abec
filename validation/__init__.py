"""(under construction)"""
